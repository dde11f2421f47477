"""``calque pool iam-policy``: print the IAM documents of one pool (its workers' role, the controller's policy)."""

from __future__ import annotations

import click

from calque.cli.options import region_option
from calque.cli.output import to_json
from calque.errors import UsageError

DOCUMENTS = ("all", "worker", "trust", "controller")


@click.command("iam-policy")
@click.option("--pool", "pool_name", required=True, help="The pool's name, e.g. lab-a/embedder.")
@click.option("--bucket", required=True, help="The pool's S3 bucket.")
@click.option("--account", required=True, help="The AWS account id, 12 digits (aws sts get-caller-identity).")
@click.option("--prefix", default="calque", show_default=True, help="Key prefix in the bucket (the spec's prefix).")
@click.option(
    "--document",
    type=click.Choice(DOCUMENTS),
    default="all",
    show_default=True,
    help="worker: the role's inline policy; trust: who may assume it; controller: what pool.yml needs; "
    "all: every name and document as JSON.",
)
@region_option
def iam_policy(pool_name: str, bucket: str, account: str, prefix: str, document: str, region: str | None) -> None:
    """Print the IAM policy documents of a pool, rendered from its name (no AWS call).

    The workers' role may use the pool's own queue, its own keys in the bucket and its own Auto
    Scaling group, nothing else; the controller's policy is what running playbooks/pool.yml for the
    pool needs, including iam:PassRole for that role alone. calque.gpu.pool_iam_policy returns the
    same documents to the playbook.
    """
    from calque.ops.pool_iam_policy import PoolIamOp

    if not region:
        raise UsageError("no region: pass --region (or set AWS_REGION), e.g. --region us-east-1")
    op = PoolIamOp()
    request = op.request({"pool": pool_name, "bucket": bucket, "region": region, "account": account, "prefix": prefix})
    docs = op.run(request).result
    if document == "all":
        click.echo(to_json(docs))
    else:
        chosen = {"worker": docs.worker_policy, "trust": docs.trust_policy, "controller": docs.controller_policy}
        click.echo(to_json(chosen[document]))

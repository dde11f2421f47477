"""``calque session fleet``: what an elastic session host's user-data and its fleet helper run (issue 25).

Root's commands on a host of an Auto Scaling class, each about this instance only (its id from IMDSv2):
``munge-key`` (the institution's key from SSM or S3), ``host-config`` (its session.yaml: its name and
TCP listener), ``register``/``deregister`` (with the broker, through SSM) and ``protect`` (the helper
service: scale-in protection while a session is live, the drain when the group ends the instance).
"""

from __future__ import annotations

from pathlib import Path

import click

from calque.cli.options import DURATION, aws_options
from calque.models.imds_address import IMDS_ENDPOINT

FLEET_GUARD = Path("/run/calque/fleet-guard")  # session/scalein.py: the daemon's and the helper's hand-over
imds_option = click.option(
    "--imds", default=IMDS_ENDPOINT, show_default=True, envvar="CALQUE_IMDS", help="The IMDSv2 endpoint."
)
class_option = click.option("--class", "fleet_class", required=True, help="The session-host class (teaching-rtx6000).")


@click.group()
def fleet() -> None:
    """An elastic session host's own steps: munge key, config, registration, scale-in protection."""


@fleet.command("munge-key")
@click.option("--ssm-parameter", default=None, help="The SecureString holding base64 of munge.key.")
@click.option("--s3", "s3_uri", default=None, help="s3://BUCKET/KEY of munge.key, stored with SSE.")
@click.option("--path", type=click.Path(path_type=Path), default=Path("/etc/munge/munge.key"), show_default=True)
@aws_options
def munge_key(
    ssm_parameter: str | None, s3_uri: str | None, path: Path, region: str | None, endpoint_url: str | None,
    profile: str | None,
) -> None:  # fmt: skip
    """Install the institution's munge key (0400, the munge user's); the key is never printed."""
    from calque.aws.store import parse_s3_uri
    from calque.models.fleet import MungeKeySource
    from calque.ops.base import validated
    from calque.session.fleet.mungekey import install_key
    from calque.session.fleet.this_host import ThisHost

    bucket, key = parse_s3_uri(s3_uri) if s3_uri else (None, None)
    source = validated(
        MungeKeySource, {"ssm_parameter": ssm_parameter, "s3_bucket": bucket, "s3_key": key}, "munge key"
    )
    data = ThisHost(region=region, endpoint_url=endpoint_url, profile=profile).munge_key(source)
    changed = install_key(data, path)
    click.echo(f"munge key {'installed at' if changed else 'unchanged at'} {path} ({len(data)} bytes)")


@fleet.command("host-config")
@click.option(
    "--template", type=click.Path(exists=True, path_type=Path), required=True, help="The class's session.yaml."
)
@click.option("--out", type=click.Path(path_type=Path), default=Path("/etc/calque/session.yaml"), show_default=True)
@click.option("--port", type=click.IntRange(1, 65535), default=7461, show_default=True, help="The daemon's TCP port.")
@imds_option
def host_config(template: Path, out: Path, port: int, imds: str) -> None:
    """This host's session.yaml: the class's, named for the instance, listening on its private address."""
    import yaml

    from calque.configfile import read_mapping
    from calque.session.fleet.this_host import ThisHost
    from calque.session.session_config import SessionConfig

    here = ThisHost(imds)
    doc = read_mapping(template, "session config template", empty_ok=True)
    doc["host_name"] = here.instance_id
    doc["listen_tcp"] = {"address": here.meta("local-ipv4"), "port": port}
    doc.setdefault("scale_in_guard", str(FLEET_GUARD))  # the helper's --guard: protection before a grant
    SessionConfig.model_validate(doc)  # what the daemon will read, checked before it is written
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    click.echo(f"wrote {out} for {doc['host_name']} ({doc['listen_tcp']['address']}:{port})")


@fleet.command()
@class_option
@click.option("--offers", multiple=True, required=True, help="What this host offers (MIG profiles, mps); repeat.")
@click.option("--port", type=click.IntRange(1, 65535), default=7461, show_default=True)
@imds_option
@aws_options
def register(
    fleet_class: str, offers: tuple[str, ...], port: int, imds: str, region: str | None, endpoint_url: str | None,
    profile: str | None,
) -> None:  # fmt: skip
    """Register this host with the broker (an SSM parameter under its class's path)."""
    from calque.models.fleet import HostRegistration
    from calque.ops.base import validated
    from calque.session.fleet.this_host import ThisHost

    here = ThisHost(imds, region=region, endpoint_url=endpoint_url, profile=profile)
    iid = here.instance_id
    doc = {"name": iid, "address": here.meta("local-ipv4"), "port": port, "offers": list(offers)}
    reg = validated(HostRegistration, {**doc, "fleet_class": fleet_class, "instance_id": iid}, "registration")
    click.echo(f"registered {reg.name} at {here.register(reg)}")


@fleet.command()
@class_option
@imds_option
@aws_options
def deregister(fleet_class: str, imds: str, region: str | None, endpoint_url: str | None, profile: str | None) -> None:
    """Remove this host's registration (the broker stops routing to it)."""
    from calque.session.fleet.this_host import ThisHost

    here = ThisHost(imds, region=region, endpoint_url=endpoint_url, profile=profile)
    gone = here.deregister(fleet_class)
    click.echo(f"{'deregistered' if gone else 'was not registered:'} {here.instance_id}")


@fleet.command()
@class_option
@click.option("--every", type=DURATION, default=15.0, show_default=True, help="Seconds between looks.")
@click.option(
    "--hold", type=DURATION, default=7200.0, show_default=True, help="Longest wait for sessions on the way out."
)
@click.option("--once", is_flag=True, help="One look (protection set to match), then exit.")
@click.option("--socket", "socket_path", default=None, help="The session daemon's socket (default: its own).")
@click.option(
    "--guard",
    type=click.Path(path_type=Path),
    default=None,
    help="The daemon's scale_in_guard directory: protect before its first session (answered at once).",
)
@imds_option
@aws_options
def protect(
    fleet_class: str, every: float, hold: float, once: bool, socket_path: str | None, guard: Path | None, imds: str,
    region: str | None, endpoint_url: str | None, profile: str | None,
) -> None:  # fmt: skip
    """Keep this instance protected from scale-in while a session is live; drain when the group ends it."""
    from calque.session.fleet.protect import serve
    from calque.session.fleet.this_host import ThisHost

    here = ThisHost(imds, region=region, endpoint_url=endpoint_url, profile=profile)
    host = serve(here, fleet_class, every=every, hold=hold, once=once, socket_path=socket_path, guard=guard)
    click.echo(
        f"{host.instance_id} in {host.group}: {'protected' if host.protected else 'not protected'} from scale-in"
    )

"""``calque session fleet``: what an elastic session host's user-data and its fleet helper run (issue 25).

Root's commands on a host of an Auto Scaling class, each about this instance only (its id from IMDSv2):
``munge-key`` (the institution's key from SSM or S3), ``host-config`` (its session.yaml: its name and
TCP listener), ``register``/``deregister`` (with the broker, through SSM) and ``protect`` (the helper
service: scale-in protection while a session is live, the drain when the group ends the instance).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from calque.cli.options import DURATION, aws_options

IMDS = "http://169.254.169.254"
FLEET_GUARD = Path("/run/calque/fleet-guard")  # session/scalein.py: the daemon's and the helper's hand-over
imds_option = click.option("--imds", default=IMDS, show_default=True, envvar="CALQUE_IMDS", help="The IMDSv2 endpoint.")
class_option = click.option("--class", "fleet_class", required=True, help="The session-host class (teaching-rtx6000).")


def _imds(endpoint: str) -> Any:
    from calque.aws.imds import metadata_client
    from calque.errors import UsageError

    imds = metadata_client(endpoint)
    if imds is None:
        raise UsageError(f"offline: IMDS {endpoint} is not a loopback address")
    return imds


def _meta(imds: Any, path: str) -> str:
    from calque.errors import InfrastructureError

    value = imds.get(path)
    if not value:
        raise InfrastructureError(f"IMDS has no {path}: is this an EC2 instance?")
    return str(value).strip()


def _client(service: str, region: str | None, endpoint_url: str | None, profile: str | None) -> Any:
    from calque.aws.clients import client

    return client(service, region=region, endpoint_url=endpoint_url, profile=profile)


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
    from calque.session.fleet.mungekey import fetch_key, install_key

    bucket, key = parse_s3_uri(s3_uri) if s3_uri else (None, None)
    source = validated(
        MungeKeySource, {"ssm_parameter": ssm_parameter, "s3_bucket": bucket, "s3_key": key}, "munge key"
    )
    aws = "ssm" if source.ssm_parameter else "s3"
    data = fetch_key(source, **{aws: _client(aws, region, endpoint_url, profile)})
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
    from calque.session.config import SessionConfig

    meta = _imds(imds)
    doc = read_mapping(template, "session config template", empty_ok=True)
    doc["host_name"] = _meta(meta, "instance-id")
    doc["listen_tcp"] = {"address": _meta(meta, "local-ipv4"), "port": port}
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
    from calque.session.fleet.register import register as put

    meta = _imds(imds)
    iid = _meta(meta, "instance-id")
    doc = {"name": iid, "address": _meta(meta, "local-ipv4"), "port": port, "offers": list(offers)}
    reg = validated(HostRegistration, {**doc, "fleet_class": fleet_class, "instance_id": iid}, "registration")
    click.echo(f"registered {reg.name} at {put(_client('ssm', region, endpoint_url, profile), reg)}")


@fleet.command()
@class_option
@imds_option
@aws_options
def deregister(fleet_class: str, imds: str, region: str | None, endpoint_url: str | None, profile: str | None) -> None:
    """Remove this host's registration (the broker stops routing to it)."""
    from calque.session.fleet.register import deregister as drop

    iid = _meta(_imds(imds), "instance-id")
    gone = drop(_client("ssm", region, endpoint_url, profile), fleet_class, iid)
    click.echo(f"{'deregistered' if gone else 'was not registered:'} {iid}")


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
    from calque.errors import UsageError
    from calque.session.fleet import protect as p
    from calque.session.fleet.register import deregister as drop

    meta = _imds(imds)
    iid = _meta(meta, "instance-id")
    asg = _client("autoscaling", region, endpoint_url, profile)
    found = p.find_group(asg, iid)
    if found is None:
        raise UsageError(f"{iid} is in no Auto Scaling group: nothing to protect")
    host = p.FleetHost(asg, iid, found[0], found[1])

    def live() -> int:
        return p.live_sessions_of_daemon(socket_path)

    def terminating() -> bool:
        return bool(meta.get("autoscaling/target-lifecycle-state") == p.TERMINATING)

    def leave() -> int:
        ssm = _client("ssm", region, endpoint_url, profile)

        def drain(by_s: float) -> bool:
            # the call itself is quick; bounded by the wait so a hung one still leaves the hook in time
            return p.run_drain_step(
                p.drain_step(by_s, socket_path), timeout_s=min(60.0, p.drain_window(hold, every)[1])
            )

        return p.leave(
            host, live, drain=drain, deregister=lambda: drop(ssm, fleet_class, iid), hold_s=hold, every=every
        )

    guarded = None
    if guard is not None:
        from calque.session.scalein import ScaleInGuard

        g = ScaleInGuard(guard)
        g.prepare()
        # Asks older than this helper were answered by the one before it; a checkout waiting now asks
        # again every few milliseconds.
        guarded = p.Guarded(g, handled=g.marked_at("wanted"))
        g.set_protected(bool(host.protected))  # the group's word at the start, before the first look
    p.watch(host, live, terminating, leave, every=every, rounds=1 if once else None, guarded=guarded)
    click.echo(f"{iid} in {host.group}: {'protected' if host.protected else 'not protected'} from scale-in")

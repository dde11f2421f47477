"""``python -m tests.hosts``: boot and tear down test hosts by hand or from molecule's playbooks.

.venv/bin/python -m tests.hosts up --name demo --host mig0=rtx-pro-6000:calque_gpu_hosts
build/hosts/runs/demo/bin/ssh mig0 systemctl is-system-running
.venv/bin/python -m tests.hosts down --name demo      # or: down --all
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from . import exits
from .exits import down_all
from .fleet import Fleet, HostSpec
from .image import ensure_image
from .paths import RUNS_DIR
from .preflight import unavailable_reason
from .scenarios import run_molecule, scenarios
from .shapes import SHAPES
from .wheelhouse import ensure_wheelhouse


def _parse_host(value: str) -> HostSpec:
    """NAME=SHAPE[:GROUP,GROUP...]"""
    name, sep, rest = value.partition("=")
    if not sep:
        raise click.BadParameter(f"{value!r}: write NAME=SHAPE[:GROUP,...], e.g. mig0=rtx-pro-6000:calque_gpu_hosts")
    shape, _, groups = rest.partition(":")
    if shape not in SHAPES:
        raise click.BadParameter(f"{value!r}: unknown shape {shape!r}; use one of {', '.join(SHAPES)}")
    return HostSpec(name=name, shape=shape, groups=tuple(g for g in groups.split(",") if g))


@click.group(help="Booted Debian test hosts (systemd-nspawn), reached by ssh from a controller namespace.")
def main() -> None:
    reason = unavailable_reason()
    if reason:
        raise click.ClickException(f"test hosts cannot run here: {reason}")


@main.command(help="Boot hosts (in parallel) and write the run's inventory. HOST: NAME=SHAPE[:GROUP,...].")
@click.option(
    "--name", required=True, help="The run's name (build/hosts/runs/NAME); an old run of that name is torn down first."
)
@click.option(
    "--host", "hosts", multiple=True, required=True, help=f"NAME=SHAPE[:GROUP,...]; shapes: {', '.join(SHAPES)}."
)
@click.option(
    "--wheelhouse",
    type=click.Path(file_okay=False, path_type=Path),
    help="Set calque_runtime_wheelhouse to this directory.",
)
@click.option(
    "--build-wheelhouse",
    is_flag=True,
    help="Build (or reuse) this checkout's wheelhouse and set calque_runtime_wheelhouse to it.",
)
@click.option(
    "--runtime-deps",
    is_flag=True,
    help="Boot with the wheelhouse's pinned dependencies already in the runtime's virtualenv (as a golden image "
    "would have them; for runs that test something other than that install). Needs a wheelhouse.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the run as JSON (inventory, hosts, ssh wrapper).")
def up(
    name: str,
    hosts: tuple[str, ...],
    wheelhouse: Path | None,
    build_wheelhouse: bool,
    runtime_deps: bool,
    as_json: bool,
) -> None:
    specs = [_parse_host(h) for h in hosts]
    if build_wheelhouse:
        wheelhouse = ensure_wheelhouse()
    if runtime_deps and wheelhouse is None:
        raise click.UsageError("--runtime-deps needs --wheelhouse DIR or --build-wheelhouse")
    house = wheelhouse.resolve() if wheelhouse else None
    f = Fleet(name).up(specs, wheelhouse=house, runtime_deps=house if runtime_deps else None)
    exits.detach(f)  # stays up after this command; `down` ends it
    doc = {
        "name": f.name,
        "inventory": str(f.inventory),
        "ssh": str(f.bin / "ssh"),
        "controller_ns": f.controller_ns,
        "wheelhouse": f.state.wheelhouse,
        "hosts": [{"name": h.name, "address": h.address, "shape": h.shape, "groups": h.groups} for h in f.hosts],
    }
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    for h in f.hosts:
        click.echo(f"{h.name:20} {h.address:14} {h.shape:14} {','.join(h.groups)}")
    click.echo(f"inventory: {f.inventory}")
    click.echo(f"ssh:       {f.bin / 'ssh'} HOST")


@main.command(help="Tear a run down (hosts, namespaces, servers, files), or with --all every run and leftover.")
@click.option("--name", help="The run to tear down.")
@click.option(
    "--all", "everything", is_flag=True, help="Every run, and namespaces/processes/mounts a crashed run left."
)
def down(name: str | None, everything: bool) -> None:
    if bool(name) == everything:
        raise click.UsageError("give --name NAME or --all")
    done = down_all() if everything else Fleet(name or "").down()
    for line in done:
        click.echo(f"removed {line}")


@main.command("list", help="The runs that are up.")
def list_runs() -> None:
    if not RUNS_DIR.is_dir():
        return
    for d in sorted(RUNS_DIR.iterdir()):
        if (d / "state.json").exists():
            f = Fleet(d.name)
            hosts = ", ".join(f"{h.name}={h.address}{'' if h.running() else ' (down)'}" for h in f.hosts)
            click.echo(f"{f.name}: {hosts}")


@main.command(
    "molecule",
    context_settings={"ignore_unknown_options": True},
    help="Run molecule for one of calque.gpu's scenarios from the collection's root, with this checkout's "
    "own working directory (e.g. `molecule pool_worker test`, `molecule pool_worker converge`).",
)
@click.argument("scenario")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def molecule_cmd(scenario: str, args: tuple[str, ...]) -> None:
    known = scenarios()
    if scenario not in known:
        raise click.BadParameter(f"no scenario {scenario!r}; scenarios: {', '.join(known) or 'none'}")
    sys.exit(run_molecule(scenario, list(args) or ["test"]))


@main.command(
    help="Dress a run as the institution's (docs/institution.md): the stand-in NVIDIA driver installed like an AWS "
    "Deep Learning AMI on every host (the hosts reach no NVIDIA repository), and an inventory folder of the "
    "institution's group_vars over the run's hosts with per-host host_vars; prints the ansible-playbook arguments."
)
@click.option("--name", required=True, help="A run that is up (`up --name NAME`).")
@click.option(
    "--host-vars",
    "host_vars",
    multiple=True,
    help="HOST=FILE: a YAML file of that host's variables (e.g. its own calque_session_service_mps).",
)
@click.option("--no-driver", is_flag=True, help="Skip the stand-in driver (already installed on this run).")
@click.option(
    "--frontdoor",
    default=None,
    help="A host of the run (group calque_session_frontdoor) to be the broker: the inventory's institution then "
    "lists the run's session hosts at their addresses (munge, institution.yaml, TCP) instead of example.edu's.",
)
def institution(name: str, host_vars: tuple[str, ...], no_driver: bool, frontdoor: str | None) -> None:
    import yaml

    from .institution import institution_inventory, prepare_dlami, run_institution

    f = Fleet(name)
    if not f.hosts:
        raise click.UsageError(f"no run {name!r} is up: start it with `up --name {name} ...`")
    per_host: dict[str, dict[str, object]] = {}
    for item in host_vars:
        host, sep, path = item.partition("=")
        if not sep or host not in {h.name for h in f.hosts}:
            raise click.BadParameter(f"{item!r}: write HOST=FILE with a host of run {name}")
        per_host[host] = dict(yaml.safe_load(Path(path).read_text()) or {})
    if frontdoor is not None and frontdoor not in {h.name for h in f.hosts}:
        raise click.BadParameter(f"{frontdoor!r} is not a host of run {name}", param_hint="--frontdoor")
    if not no_driver:
        prepare_dlami(f, hosts=[h.name for h in f.hosts if h.name != frontdoor])
    inst = run_institution(f, frontdoor) if frontdoor is not None else None
    folder, extra = institution_inventory(
        f, Path(f.state.wheelhouse or ensure_wheelhouse()), host_vars=per_host, institution=inst
    )
    click.echo(f"-i {folder} -e @{extra}")


@main.command(help="Build (or find) the cached Debian image and print its path.")
def image() -> None:
    click.echo(str(ensure_image()))


@main.command(help="Build (or find) this checkout's calque wheelhouse and print its path.")
def wheelhouse() -> None:
    click.echo(str(ensure_wheelhouse()))


if __name__ == "__main__":
    sys.exit(main())

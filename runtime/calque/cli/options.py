"""Options shared by several verbs, defined once so two verbs never spell a flag differently."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print the result as JSON (the same data as the human view)."
)

region_option = click.option("--region", envvar="AWS_REGION", default=None, help="AWS region.")
endpoint_option = click.option(
    "--endpoint-url",
    envvar="AWS_ENDPOINT_URL",
    default=None,
    help="AWS endpoint (e.g. a moto server on 127.0.0.1); defaults to AWS_ENDPOINT_URL.",
)
profile_option = click.option("--profile", envvar="AWS_PROFILE", default=None, help="AWS profile name.")


def path_option(flag: str, dest: str, *, envvar: str, default: str | None, help: str) -> Callable[[F], F]:
    """A path a verb reads (a socket, a file): also from ``envvar``, its default shown where it has one."""
    return click.option(
        flag,
        dest,
        type=click.Path(path_type=Path),
        envvar=envvar,
        default=default,
        show_default=default is not None,
        help=help,
    )


bucket_option = click.option(
    "--bucket", envvar="CALQUE_POOL_BUCKET", default=None, help="The pool's S3 bucket (or CALQUE_POOL_BUCKET)."
)
prefix_option = click.option("--prefix", default="calque", show_default=True, help="Key prefix in the bucket.")


def _keep_pool(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    ctx.meta["calque.pool"] = value


# Not passed to the command: calque.cli.pool's helpers read it (the pool, when given, names the queue).
pool_name_option = click.option(
    "--pool",
    default=None,
    expose_value=False,
    callback=_keep_pool,
    help="The pool's name (lab-a/embedder): its queue derives from it. Omit for a pool named by its model only.",
)


def given_pool_queue() -> str | None:
    """The queue of the running command's --pool (None when not given: the queue derives from --model)."""
    value = click.get_current_context().meta.get("calque.pool")
    if value is None:
        return None
    from calque.models.pool_names import pool_names

    try:
        return pool_names(value).queue
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--pool") from None


def aws_options(f: F) -> F:
    """--region, --endpoint-url and --profile, stacked."""
    for opt in (profile_option, endpoint_option, region_option):
        f = opt(f)
    return f


spend_consent_option = click.option(
    "--i-understand-this-spends-money",
    "spend_consent",
    is_flag=True,
    help="Required to launch EC2 instances: they bill until terminated.",
)

shared_gpu_consent_option = click.option(
    "--i-understand-shared-gpu-has-no-isolation",
    "shared_gpu_consent",
    is_flag=True,
    help="Required for MPS: tenants of one GPU share memory and faults, with no isolation.",
)


python_version_option = click.option(
    "--python-version",
    default=None,
    help="Python the wheels are for, e.g. 3.11 (Debian 12); default: this controller's.",
)
platform_option = click.option(
    "--platform",
    default=None,
    help="Platform tag the wheels are for, e.g. manylinux2014_x86_64; default: this controller's.",
)


def wheelhouse_target_options(f: F) -> F:
    """--python-version and --platform of a wheelhouse, stacked."""
    for opt in (platform_option, python_version_option):
        f = opt(f)
    return f


def gpu_backend_flags(f: F) -> F:
    """--gpu-backend, --sim-state and --host-config as three plain values (None when not given), in the
    vocabulary the host config, the modules and the session config share (``calque.gpu.selection``)."""
    from calque.gpu.selection import BACKENDS

    for opt in (
        click.option(
            "--host-config",
            type=click.Path(dir_okay=False, path_type=Path),
            envvar="CALQUE_HOST_CONFIG",
            default=None,
            help="Host configuration read by --gpu-backend host (default /etc/calque/host.yaml).",
        ),
        click.option(
            "--sim-state",
            "--gpu-state",
            "sim_state",
            type=click.Path(dir_okay=False, path_type=Path),
            envvar=["CALQUE_SIM_STATE", "CALQUE_GPU_STATE"],
            default=None,
            help="A simulated host's state file (alone, it means --gpu-backend sim).",
        ),
        click.option(
            "--gpu-backend",
            type=click.Choice(BACKENDS),
            envvar="CALQUE_GPU_BACKEND",
            default=None,
            help="host: as the host configuration says (default); nvml; sim; none.",
        ),
    ):
        f = opt(f)
    return f


class DurationType(click.ParamType[float, Any]):
    """A click type for durations in the one grammar (``calque.durations``): ``90``, ``30m``, ``1h 30m``."""

    name = "duration"

    def __init__(self, *, whole: bool = False) -> None:
        self.whole = whole  # whole seconds, for settings AWS takes as integers

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        from calque.durations import DurationError, parse_duration, parse_seconds

        what = f"--{param.name.replace('_', '-')}" if param is not None and param.name else ""
        try:
            return (parse_seconds if self.whole else parse_duration)(value, what=what)
        except DurationError as exc:
            self.fail(str(exc), param, ctx)


DURATION = DurationType()
WHOLE_DURATION = DurationType(whole=True)


def gpu_backend_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The same three flags, handed to the command as one ``gpu`` argument (a ``GpuSelection``)."""
    from calque.gpu.selection import GpuSelection

    @functools.wraps(f)
    def with_selection(
        *args: Any, gpu_backend: str | None, sim_state: Path | None, host_config: Path | None, **kwargs: Any
    ) -> Any:
        sel = GpuSelection(gpu_backend or "host", sim_state=sim_state, host_config=host_config)  # type: ignore[arg-type]
        return f(*args, gpu=sel, **kwargs)

    return gpu_backend_flags(with_selection)


session_socket_option = click.option(
    "--session-socket",
    type=click.Path(dir_okay=False),
    envvar="CALQUE_SESSION_SOCKET",
    default=None,
    help="The session daemon's socket: its live sessions make slices busy (default /run/calque/session.sock).",
)

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

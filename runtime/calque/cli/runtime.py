"""``calque runtime ...``: packaging the runtime for hosts: the wheel and its pinned wheelhouse."""

from __future__ import annotations

from pathlib import Path

import click

from calque.cli.options import json_option, wheelhouse_target_options
from calque.cli.output import emit, progress_to_stderr


@click.group()
def runtime() -> None:
    """Package the calque runtime for hosts that install it (pool instances, Ansible's runtime role)."""


def _render(house: dict[str, object]) -> str:
    pins = house["pins"]
    assert isinstance(pins, dict)
    lines = [f"{house['path']}: {house['calque_wheel']} and {len(pins) - 1} pinned dependencies"]
    lines += [f"  {name}=={version}" for name, version in sorted(pins.items())]
    lines.append(f"install: pip install --no-index --find-links {house['path']} -r {house['path']}/requirements.txt")
    return "\n".join(lines)


@runtime.command("wheelhouse")
@click.argument("out_dir", type=click.Path(file_okay=False, path_type=Path))
@wheelhouse_target_options
@click.option("--hashes", is_flag=True, help="Write --hash=sha256:... on every requirements.txt line.")
@click.option(
    "--wheel",
    "wheel_path",
    default=None,
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="Use this built calque wheel instead of building the running calque's sources.",
)
@click.option(
    "--notebooks",
    is_flag=True,
    help="Add notebooks/: the notebooks extra's wheels (JupyterHub, JupyterLab, the proxy), indexed alike.",
)
@json_option
def wheelhouse(
    out_dir: Path,
    python_version: str | None,
    platform: str | None,
    hashes: bool,
    wheel_path: Path | None,
    notebooks: bool,
    as_json: bool,
) -> None:
    """Write calque's wheel and every runtime dependency, pinned as in constraints.txt, to OUT_DIR.

    OUT_DIR (new or empty) gets exactly one calque-<version>-py3-none-any.whl, the dependency wheels,
    requirements.txt and SHA256SUMS. A host with no index installs it with
    `pip install --no-index --find-links OUT_DIR -r OUT_DIR/requirements.txt`. Wheels come from pip's
    configured index or cache (binary only). With --notebooks OUT_DIR/notebooks/ holds the notebooks
    extra's wheels with their own requirements.txt and SHA256SUMS, for the hub and the session hosts'
    single-user servers (installed into the same venv after the runtime).
    """
    from calque.packaging import build_wheelhouse

    house = build_wheelhouse(
        out_dir,
        python_version=python_version,
        platform=platform,
        hashes=hashes,
        wheel=wheel_path,
        notebooks=notebooks,
        progress=progress_to_stderr,
    )
    data: dict[str, object] = {
        "path": str(house.path),
        "calque_wheel": house.calque_wheel,
        "pins": house.pins,
        "files": house.files,
    }
    emit(data, as_json, _render)

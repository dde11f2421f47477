"""The user-data's shell functions that install the runtime, shared by every kind of instance calque boots.

A pool worker's user-data (``calque.pool.bootstrap``) and an elastic session host's
(``calque.session.fleet.userdata``) both carry them: ``fetch URL DEST`` (a few bounded tries, curl or
the standard library) and ``install_runtime VENV [PIP_ARGS...]`` (the staged wheelhouse with
``--no-index``, else the staged wheel, else ``@RUNTIME_PIP@``; sha256 checked). They read ``$PY``,
``$WHEELHOUSE_URL``/``$WHEELHOUSE_SHA256``, ``$RUNTIME_URL``/``$RUNTIME_SHA256``/``$RUNTIME_WHEEL``.
"""

from __future__ import annotations

import re
import shlex
from typing import TypedDict

from calque import __version__
from calque.errors import UsageError


class RuntimeSource(TypedDict, total=False):
    """Where an instance gets the runtime, as both user-datas take it (keyword arguments): ``runtime_pip``
    when given (an explicit override), else the staged wheel ``runtime_url`` (its ``runtime_sha256``
    checked), else ``calque==<this version>``; a staged wheelhouse (``wheelhouse_url``, its
    ``wheelhouse_sha256``) before the wheel alone: calque and exactly its pinned dependencies."""

    runtime_pip: str | None
    runtime_url: str | None
    runtime_sha256: str | None
    wheelhouse_url: str | None
    wheelhouse_sha256: str | None


def default_runtime_pip() -> str:
    """The pip requirement that installs this runtime's version on an instance."""
    return f"calque=={__version__}"


def runtime_values(source: RuntimeSource) -> dict[str, str]:
    """The user-data's values for ``install_runtime`` (below) from ``source``; a staged URL without its
    sha256 is refused, before any instance could download an unchecked file."""
    pip = source.get("runtime_pip")
    url = "" if pip else (source.get("runtime_url") or "")
    house = "" if pip else (source.get("wheelhouse_url") or "")
    wheel_sha, house_sha = source.get("runtime_sha256"), source.get("wheelhouse_sha256")
    for what, u, sha in (("runtime URL", url, wheel_sha), ("wheelhouse URL", house, house_sha)):
        if u and not re.fullmatch(r"[0-9a-f]{64}", sha or ""):
            raise UsageError(f"a staged {what} needs its sha256 (64 hex digits)")
    return {
        "@RUNTIME_URL@": shlex.quote(url),
        "@RUNTIME_SHA256@": shlex.quote(wheel_sha or ""),
        "@WHEEL_NAME@": shlex.quote(f"calque-{__version__}-py3-none-any.whl"),
        "@WHEELHOUSE_URL@": shlex.quote(house),
        "@WHEELHOUSE_SHA256@": shlex.quote(house_sha or ""),
        "@RUNTIME_PIP@": shlex.quote(pip or default_runtime_pip()),
    }


RUNTIME_FUNCTIONS = r"""fetch() {  # URL DEST: a few tries, each bounded
  local i
  for i in 1 2 3 4 5; do
    if command -v curl >/dev/null; then
      curl -fsS --connect-timeout 10 --max-time 300 -o "$2" "$1" && return 0
    else
      "$PY" - "$1" "$2" <<'CALQUE_FETCH' && return 0
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=300) as r, open(sys.argv[2], "wb") as f:
    f.write(r.read())
CALQUE_FETCH
    fi
    echo "calque bootstrap: download failed (try $i)"; sleep $((i * 3))
  done
  return 1
}

install_runtime() {  # VENV [PIP_ARGS...]: calque into VENV (created when missing)
  local venv=$1 dir; shift
  if [ ! -x "$venv/bin/python" ]; then
    "$PY" -m venv "$venv"
    "$venv/bin/pip" install --quiet --upgrade pip
  fi
  if [ -n "$WHEELHOUSE_URL" ]; then  # exactly the pins CI tested, from no index
    dir=$(mktemp -d)
    fetch "$WHEELHOUSE_URL" "$dir/wheelhouse.tar"
    echo "$WHEELHOUSE_SHA256  $dir/wheelhouse.tar" | sha256sum -c --quiet -
    tar -xf "$dir/wheelhouse.tar" -C "$dir"
    (cd "$dir" && sha256sum -c --quiet SHA256SUMS)
    "$venv/bin/pip" install --quiet --no-index --find-links "$dir" -r "$dir/requirements.txt" "$@"
    rm -rf "$dir"
  elif [ -n "$RUNTIME_URL" ]; then
    dir=$(mktemp -d)
    fetch "$RUNTIME_URL" "$dir/$RUNTIME_WHEEL"
    echo "$RUNTIME_SHA256  $dir/$RUNTIME_WHEEL" | sha256sum -c --quiet -
    "$venv/bin/pip" install --quiet "$@" "$dir/$RUNTIME_WHEEL"  # dependencies from the configured index
    rm -rf "$dir"
  else
    "$venv"/bin/pip install --quiet @RUNTIME_PIP@ "$@"
  fi
}

"""

"""What ``python -m calque.session.daemon`` and ``python -m calque.session.broker`` share: the config
their command read (flags applied) arrives as JSON in an environment variable, or is read from the
default file; a calque error is one line on stderr and its exit code, as the CLI root would print it."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TypeVar

from pydantic import BaseModel

from calque.errors import CalqueError

C = TypeVar("C", bound=BaseModel)


def run_service(config_env: str, model: type[C], load_default: Callable[[], C], run: Callable[[C], None]) -> int:
    """Run ``run`` with the config from ``config_env`` (removed, so children never see it) or
    ``load_default()``; the exit status."""
    try:
        raw = os.environ.pop(config_env, None)
        run(model.model_validate_json(raw) if raw is not None else load_default())
    except CalqueError as exc:
        print(f"calque: error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0

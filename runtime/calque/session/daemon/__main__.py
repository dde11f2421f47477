"""``python -m calque.session.daemon``: what ``calque session serve`` execs, with the config it read
(and its flags applied) as JSON in ``CALQUE_SESSION_DAEMON_CONFIG``, so the command's own process
never imports the daemon."""

from __future__ import annotations

import os
import sys

from calque.errors import CalqueError

CONFIG_ENV = "CALQUE_SESSION_DAEMON_CONFIG"


def main() -> int:
    from calque.session.daemon.daemon_process import run_daemon
    from calque.session.session_config import SessionConfig, load_config

    try:
        raw = os.environ.pop(CONFIG_ENV, None)
        config = SessionConfig.model_validate_json(raw) if raw is not None else load_config(None)
        run_daemon(config)
    except CalqueError as exc:
        print(f"calque: error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m calque.session.daemon``: what ``calque session serve`` execs, with the config it read
(and its flags applied) as JSON in ``CALQUE_SESSION_DAEMON_CONFIG``, so the command's own process
never imports the daemon."""

from __future__ import annotations

import sys

CONFIG_ENV = "CALQUE_SESSION_DAEMON_CONFIG"


def main() -> int:
    from calque.session.daemon.daemon_process import run_daemon
    from calque.session.service_entry import run_service
    from calque.session.session_config import SessionConfig, load_config

    return run_service(CONFIG_ENV, SessionConfig, lambda: load_config(None), run_daemon)


if __name__ == "__main__":
    sys.exit(main())

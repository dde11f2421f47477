"""``python -m calque.session.broker``: what ``calque session broker`` execs, with the config it read
(and its flags applied) as JSON in ``CALQUE_BROKER_CONFIG_JSON``."""

from __future__ import annotations

import sys

CONFIG_ENV = "CALQUE_BROKER_CONFIG_JSON"


def main() -> int:
    from calque.session.broker.broker_config import BrokerConfig, load_broker_config
    from calque.session.broker.broker_process import run_broker
    from calque.session.broker.links import load_institution
    from calque.session.service_entry import run_service

    return run_service(
        CONFIG_ENV, BrokerConfig, lambda: load_broker_config(None), lambda c: run_broker(c, load_institution(c))
    )


if __name__ == "__main__":
    sys.exit(main())

"""``python -m calque.session.broker``: what ``calque session broker`` execs, with the config it read
(and its flags applied) as JSON in ``CALQUE_BROKER_CONFIG_JSON``."""

from __future__ import annotations

import os
import sys

from calque.errors import CalqueError

CONFIG_ENV = "CALQUE_BROKER_CONFIG_JSON"


def main() -> int:
    from calque.session.broker.broker_config import BrokerConfig, load_broker_config
    from calque.session.broker.broker_process import run_broker
    from calque.session.broker.links import load_institution

    try:
        raw = os.environ.pop(CONFIG_ENV, None)
        config = BrokerConfig.model_validate_json(raw) if raw is not None else load_broker_config(None)
        run_broker(config, load_institution(config))
    except CalqueError as exc:
        print(f"calque: error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())

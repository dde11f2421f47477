"""Watch for an EC2 spot interruption notice over IMDSv2 and ask the worker to stop.

IMDSv2: ``PUT /latest/api/token`` (with ``X-aws-ec2-metadata-token-ttl-seconds``) returns a token;
``GET /latest/meta-data/spot/instance-action`` with ``X-aws-ec2-metadata-token`` returns 404 until
AWS schedules the interruption (about two minutes ahead), then 200 with ``{"action", "time"}``.
A GET without a token is refused (401), as on instances that require IMDSv2.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.error
from collections.abc import Callable

from calque.aws.imds import Imds

log = logging.getLogger("calque.pool.worker.spot")


class SpotWatcher:
    """Polls ``spot/instance-action`` every ``interval_s``; calls ``on_notice(action)`` once."""

    def __init__(self, imds: Imds, interval_s: float, on_notice: Callable[[str], None]) -> None:
        self.imds = imds
        self.interval_s = interval_s
        self.on_notice = on_notice
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="calque-spot", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def poll_once(self) -> str | None:
        body = self.imds.get("spot/instance-action")
        if body is None:
            return None
        try:
            action = str(json.loads(body).get("action", "terminate"))
        except (ValueError, AttributeError):
            action = "terminate"
        return action

    def _run(self) -> None:
        warned = False
        while not self._stop.is_set():
            try:
                action = self.poll_once()
                if action is not None:
                    log.warning("spot interruption notice (%s): stopping", action)
                    self.on_notice(action)
                    return
            except (OSError, urllib.error.URLError) as exc:
                if not warned:
                    log.warning("cannot reach IMDS at %s (%s); will keep trying", self.imds.endpoint, exc)
                    warned = True
            self._stop.wait(self.interval_s)

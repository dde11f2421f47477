"""The fair-reserve row's class reservation, made through the real broker as root would make it with
``calque session reserve --name --group --profile --count --at --for --release-unused-after``."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone
from pathlib import Path

from .institution import RELEASE_UNUSED_S, RESERVED
from .launch import LabUser
from .mapping import Window


def reserve(sock: Path, users: dict[str, LabUser], window: Window, lead_s: float) -> str:
    """Reserve from ``lead_s`` from now (the replay's first second) to past the window's end; its name."""
    from calque.models.reservation import ReserveArgs
    from calque.session.client.broker import BrokerClient

    lab, profile, count = RESERVED
    at = datetime.now(timezone.utc) + timedelta(seconds=lead_s)
    args = ReserveArgs(
        name="replay-class",
        group=users[lab].group,
        profile=profile,
        count=count,
        at=at.isoformat(timespec="seconds"),
        duration=f"{math.ceil(window.replay_s) + 10}s",
        release_unused_after=f"{max(1, math.ceil(RELEASE_UNUSED_S / window.compression))}s",
        lab=lab,
    )
    BrokerClient(sock).call("reserve", args.model_dump(mode="json"))
    return args.name

"""The idle rule on its own: which slice is active, from processes and the driver's samples."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from calque.models import DeviceSample
from calque.models.session import Session, Slice
from calque.session.config import IdlePolicy, SessionConfig
from calque.session.daemon.idle import idle_clock, is_active, slice_activity
from calque.session.daemon.rows import Held

GPU = "GPU-00000000-0000-0000-0000-000000000001"
MIG = "MIG-00000000-0000-0000-0000-000000000002"


def _held(kind: str) -> Held:
    sl = Slice(
        id=MIG if kind == "mig" else "mps-gpu1-slot0",
        kind=kind,  # type: ignore[arg-type]
        gpu_index=1,
        gpu_uuid=GPU,
        profile="1g.10gb" if kind == "mig" else "mps",
        mig_uuid=MIG if kind == "mig" else None,
    )
    t = datetime(2026, 12, 1, tzinfo=timezone.utc)
    s = Session(
        id="s-1", slice_id=sl.id, kind=sl.kind, profile=sl.profile, gpu_index=1, uid=1000, gid=1000, user="u",
        created_at=t, expires_at=t,
    )  # fmt: skip
    return Held(session=s, slice=sl, last_active=t.timestamp())


def _s(kind: str, uuid: str, pct: float | None, pid: int | None = None) -> DeviceSample:
    return DeviceSample(device_uuid=uuid, kind=kind, pid=pid, sm_percent=pct, source="sim")  # type: ignore[arg-type]


def test_a_mig_slice_is_idle_without_a_process_or_below_the_threshold_and_active_when_unknown() -> None:
    h = _held("mig")
    assert not is_active(h, [], [_s("mig", MIG, 90.0)], 5.0)  # no process of the holder: idle
    assert not is_active(h, [7], [_s("mig", MIG, 4.9)], 5.0)
    assert is_active(h, [7], [_s("mig", MIG, 5.0)], 5.0)
    assert is_active(h, [7], [_s("mig", MIG, None)], 5.0)  # unknown: active
    assert is_active(h, [7], [], 5.0)  # no sample at all: unknown, active
    assert is_active(h, [7], [_s("mig", MIG, 0.0)], 0.0)  # idle_expiry's rule: a process is enough


def test_an_mps_slot_uses_its_holders_clients_then_the_whole_gpu() -> None:
    h = _held("mps")
    others_busy = [_s("process", GPU, 0.0, 7), _s("process", GPU, 80.0, 8), _s("gpu", GPU, 80.0)]
    assert slice_activity(h, [7], others_busy) == 0.0  # another user's client is not this holder's work
    assert not is_active(h, [7], others_busy, 5.0)
    unknown_own = [_s("process", GPU, None, 7), _s("gpu", GPU, 30.0)]
    assert slice_activity(h, [7], unknown_own) == 30.0  # the GPU as a whole: can keep a slot, never end it early
    assert is_active(h, [7], [_s("process", GPU, None, 7), _s("gpu", GPU, None)], 5.0)


def test_the_clock_shown_and_the_policy_read_from_the_config() -> None:
    h = _held("mig")
    p = IdlePolicy.model_validate({"below": "5%", "for": "30m", "warn": "10m"})
    active_at, ends = idle_clock(p, h, exempt=False)
    assert active_at is not None and ends is not None and (ends - active_at).total_seconds() == 1800
    assert idle_clock(p, h, exempt=True) == (None, None) and idle_clock(None, h, exempt=False) == (None, None)
    assert SessionConfig().idle_policy is None  # off by default
    with pytest.raises(ValueError, match="not both"):
        SessionConfig.model_validate({"idle_expiry": "30m", "idle": {"for": "30m"}})

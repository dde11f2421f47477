"""The idle rule on its own: which slice is active, from every reading of the driver, and the policy."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from calque.models import DeviceSample, GpuProcess
from calque.models.session import Session, Slice
from calque.session.daemon.activity import slice_reading
from calque.session.daemon.idle import idle_clock
from calque.session.daemon.rows import Held
from calque.session.session_config import IdlePolicy, SessionConfig

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


def _s(kind: str, uuid: str, pct: float | None, pid: int | None = None, mem: int | None = 0) -> DeviceSample:
    return DeviceSample(device_uuid=uuid, kind=kind, pid=pid, sm_percent=pct, memory_used_mib=mem, source="sim")  # type: ignore[arg-type]


def _p(pid: int, uuid: str, mem: int = 0) -> GpuProcess:
    return GpuProcess(pid=pid, device_uuid=uuid, used_memory_mib=mem)


def _policy(**kw: object) -> IdlePolicy:
    return IdlePolicy.model_validate({"below": "5%", "for": "30m", "warn": "10m", **kw})


def _active(
    h: Held, procs: list[GpuProcess], samples: list[DeviceSample], policy: IdlePolicy, clients: tuple[int, ...] = ()
) -> bool:
    return slice_reading(h, list(clients), procs, samples, policy).active


def test_a_mig_slice_is_read_before_anyone_is_asked_whose_work_it_is() -> None:
    h, p = _held("mig"), _policy()
    root = [_p(4242, MIG)]  # no process of the holder: root's, in a container
    assert _active(h, root, [_s("mig", MIG, 90.0)], p)  # GPM busy: active, whoever runs there
    assert _active(h, [], [_s("mig", MIG, 90.0)], p)  # even with no process listed at all
    assert _active(h, root, [_s("mig", MIG, None)], p)  # a process and unknown engines: active
    assert _active(h, [], [], p)  # no reading of the device at all: unknown, active
    assert not _active(h, [], [_s("mig", MIG, None)], p)  # nothing on it, no memory: idle, GPM or not
    assert not _active(h, root, [_s("mig", MIG, 4.9)], p)  # measured below, nothing held
    assert not _active(h, root, [_s("mig", MIG, 0.0)], _policy(below="0%"))  # 0 % is no activity


def test_device_memory_in_use_by_anyone_is_activity_unless_the_policy_says_not() -> None:
    h = _held("mig")
    quiet = [_s("mig", MIG, 0.0, mem=3000)]  # a notebook holding a model, computing nothing
    assert _active(h, [], quiet, _policy())
    assert _active(h, [_p(4242, MIG, mem=500)], [_s("mig", MIG, 0.0, mem=0)], _policy())  # root's context
    assert _active(h, [], [_s("mig", MIG, 0.0, mem=None)], _policy())  # memory unknown: active
    assert not _active(h, [], [_s("mig", MIG, 0.0, mem=10)], _policy())  # the driver's own reservation
    assert not _active(h, [], quiet, _policy(memory_from="4GiB"))  # a bare context or a small model: idle
    assert not _active(h, [], quiet, _policy(memory_from=None))
    assert _active(h, [], [_s("mig", MIG, 0.0, mem=5000)], _policy(memory_from="4GiB"))


def test_an_mps_slot_is_its_holders_clients_and_a_missing_sample_is_unknown_never_zero() -> None:
    h, p = _held("mps"), _policy(memory_from=None)
    procs = [_p(7, GPU), _p(8, GPU), _p(9, GPU)]
    others_busy = [_s("process", GPU, 0.0, 7), _s("process", GPU, 80.0, 8), _s("gpu", GPU, 80.0)]
    assert not _active(h, procs, others_busy, p, clients=(7,))  # another user's client is not this holder's work
    assert _active(h, procs, [_s("process", GPU, 0.0, 7), _s("process", GPU, None, 9), _s("gpu", GPU, 0.0)], p, (7, 9))
    # 9 has no per-process sample at all (the driver did not sample it): unknown, so active.
    assert _active(h, procs, [_s("process", GPU, 0.0, 7), _s("gpu", GPU, 0.0)], p, clients=(7, 9))
    assert not _active(h, procs, [_s("gpu", GPU, 90.0)], p, clients=())  # no client of hers: nothing of hers runs
    held = [_p(7, GPU, mem=512)]
    assert _active(h, held, [_s("process", GPU, 0.0, 7)], _policy(), clients=(7,))  # her client holds memory


def test_the_clock_shown_and_the_policy_read_from_the_config() -> None:
    h = _held("mig")
    p = IdlePolicy.model_validate({"below": "5%", "for": "30m", "warn": "10m"})
    active_at, ends = idle_clock(p, h, exempt=False)
    assert active_at is not None and ends is not None and (ends - active_at).total_seconds() == 1800
    assert idle_clock(p, h, exempt=True) == (None, None) and idle_clock(None, h, exempt=False) == (None, None)
    assert SessionConfig().idle_policy is None  # off by default
    with pytest.raises(ValueError, match="not both"):
        SessionConfig.model_validate({"idle_expiry": "30m", "idle": {"for": "30m"}})


def test_the_checkpoint_signal_and_memory_threshold_are_checked_with_clear_errors() -> None:
    p = _policy(checkpoint_signal="SIGUSR1", checkpoint_before="2m", memory_from="1GiB")
    assert (p.checkpoint_signal, p.checkpoint_before, p.memory_from) == ("SIGUSR1", 120.0, 1024)
    assert _policy().checkpoint_signal is None and _policy().memory_from == 64  # off, and a context's worth
    with pytest.raises(ValueError, match="checkpoint_signal 'USR1' is not a signal name"):
        _policy(checkpoint_signal="USR1")
    with pytest.raises(ValueError, match=r"checkpoint_before \(1800 s\) must be shorter than idle.for"):
        _policy(checkpoint_signal="SIGUSR2", checkpoint_before="30m")
    with pytest.raises(ValueError, match="not a size"):
        _policy(memory_from="lots")
    with pytest.raises(ValueError, match="cannot be negative"):
        _policy(memory_from=-1)

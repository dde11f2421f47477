"""The views ``calque session status`` and ``list`` print from are held to the models they mirror.

``session/client/views.py`` reads the daemon's answers without pydantic (start-up); these tests make
sure it reads exactly what ``calque.models.session`` defines: the same field names and defaults, the
same values for every answer the models produce, and the same refusals.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from calque.errors import InfrastructureError, RefusedError, UsageError
from calque.models.session import Drain, Session, SessionResponse, Slice, SliceState
from calque.session.client import views
from calque.session.wire import NoFreeSliceError, decode_answer
from pydantic import ValidationError
from support.views import assert_same_fields_and_defaults

PAIRS = [
    (views.SliceView, Slice),
    (views.SessionView, Session),
    (views.SliceStateView, SliceState),
    (views.DrainView, Drain),
]
NOW = datetime(2026, 12, 2, 7, 0, 0, 123456, tzinfo=timezone.utc)


@pytest.mark.parametrize(("view", "model"), PAIRS, ids=lambda c: c.__name__)
def test_a_view_has_its_models_fields_and_defaults(view: type, model: type) -> None:
    assert_same_fields_and_defaults(view, model)


def _mig() -> Slice:
    return Slice(
        id="MIG-1", kind="mig", gpu_index=0, gpu_uuid="GPU-1", profile="1g.24gb", mig_uuid="MIG-1", gpu_minor=0,
        gi_id=7, ci_id=0, memory_mib=24000,
    )  # fmt: skip


def _mps() -> Slice:
    return Slice(
        id="mps-gpu0-slot3", kind="mps", gpu_index=0, gpu_uuid="GPU-2", profile="mps", slot=3,
        active_thread_percentage=25, pinned_mem_limit_mib=12000, pipe_directory="/run/p", log_directory="/var/log/p",
    )  # fmt: skip


def _sessions() -> list[Session]:
    live = Session(
        id="s1", slice_id="MIG-1", kind="mig", profile="1g.24gb", gpu_index=0, uid=1001, gid=1001, user="alice",
        created_at=NOW, expires_at=NOW + timedelta(hours=2), env={"CUDA_VISIBLE_DEVICES": "MIG-1"},
        warnings=["spot host"], spot=True, notice_sent=True, active_at=NOW, idle_ends_at=NOW + timedelta(minutes=30),
    )  # fmt: skip
    ended = live.model_copy(
        update={"id": "s2", "ended_at": NOW, "end_reason": "layout", "env": {}, "warnings": [], "idle_exempt": True}
    )
    return [live, ended]


def _states() -> list[SliceState]:
    return [
        SliceState(slice=_mig(), busy=True, busy_until=NOW, holder="alice", holder_uid=1001, session_id="s1"),
        SliceState(slice=_mps(), busy=False, why_not="you already hold an MPS slot on GPU 0"),
        SliceState(
            slice=_mig(),
            busy=False,
            drained=Drain(gpu=0, reason="fan swap", by_user="root", by_uid=0, since=NOW, deadline=NOW),
        ),
        SliceState(slice=_mps(), busy=False, drained=Drain(reason="reboot", by_user="ops", by_uid=7, since=NOW)),
    ]


def _same(view: Any, model: Any) -> None:
    for name in type(model).model_fields:
        ours, theirs = getattr(view, name), getattr(model, name)
        if dataclasses.is_dataclass(ours):
            _same(ours, theirs)
        else:
            assert ours == theirs, name


def test_every_field_reads_as_the_model_has_it() -> None:
    wire = json.loads(json.dumps([s.model_dump(mode="json") for s in _sessions()]))
    for view, model in zip(views.sessions(wire), _sessions(), strict=True):
        _same(view, model)
    wire = json.loads(json.dumps([s.model_dump(mode="json") for s in _states()]))
    for view, model in zip(views.slice_states(wire), _states(), strict=True):
        _same(view, model)


def test_a_drain_reads_and_says_itself_as_the_model_does() -> None:
    wire = json.loads(json.dumps([s.model_dump(mode="json") for s in _states()]))
    for view, model in zip(views.slice_states(wire), _states(), strict=True):
        if model.drained is not None:
            assert view.drained is not None and view.drained.describe() == model.drained.describe()
    assert "GPU 0 is drained by root" in _states()[2].drained.describe()  # type: ignore[union-attr]
    assert _states()[3].drained.describe().startswith("this host is drained by ops")  # type: ignore[union-attr]


def test_an_answer_the_model_would_refuse_is_refused() -> None:
    good = _sessions()[0].model_dump(mode="json")
    for bad, why, model_refuses in [
        ({**good, "tll": 5}, "unknown field", True),
        ({k: v for k, v in good.items() if k != "user"}, "user: missing", True),
        ({**good, "expires_at": "tomorrow"}, "expires_at: not an ISO 8601 time", True),
        ({**good, "env": {"A": 1}}, "env: not an object of strings", True),
        # stricter than the model's lax mode, which would read these: the daemon never sends them
        ({**good, "uid": "1001"}, "uid: not an integer", False),
        ({**good, "uid": True}, "uid: not an integer", False),
    ]:
        with pytest.raises(InfrastructureError, match=why):
            views.sessions([bad])
        refused = False
        try:
            Session.model_validate(bad)
        except ValidationError:
            refused = True
        assert refused is model_refuses, why
    with pytest.raises(InfrastructureError, match="not a list"):
        views.slice_states({"slice": {}})
    state = _states()[0].model_dump(mode="json")
    with pytest.raises(InfrastructureError, match="slice: unknown field"):
        views.slice_states([{**state, "slice": {**state["slice"], "colour": "red"}}])


def _answer(**doc: Any) -> bytes:
    return json.dumps(doc).encode()


def test_the_envelope_is_read_by_the_contracts_rules() -> None:
    ok = SessionResponse(ok=True, result=[1]).model_dump_json().encode()
    assert decode_answer(ok) == [1]
    for raw, why in [
        (_answer(version=2, ok=True, result=None), "protocol version 2 is newer than this calque reads"),
        (_answer(version="1", ok=True), "version '1' is not an integer"),
        (_answer(version=1.0, ok=True), "is not an integer"),
        (_answer(version=1, ok=True, extra=1), "unknown field"),
        (_answer(version=1, ok="yes"), "no ok"),
        (_answer(version=1, ok=False, error={"kind": "busy"}), "without a kind and a message"),
        (b"[1]", "not a JSON object"),
        (b"\xff", "cannot read"),
    ]:
        with pytest.raises(InfrastructureError, match=why):
            decode_answer(raw)
    for kind, error in [("busy", NoFreeSliceError), ("usage", UsageError), ("forbidden", RefusedError)]:
        raw = SessionResponse(ok=False, error={"kind": kind, "message": "m"}).model_dump_json().encode()
        with pytest.raises(error, match="m"):
            decode_answer(raw)


def test_status_and_list_import_no_pydantic() -> None:
    code = (
        "import sys\n"
        "import calque.cli.main, calque.cli.session, calque.session.client.views, calque.session.wire\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'pydantic_core')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"

"""The broker's cache of its hosts' slices against the grants it makes meanwhile (issue 38's race).

A list call and a grant to the same host overlap: the broker's poll asks the host for its slices, the
dispatcher's grant lands there and marks its slice busy, and then the list's answer, made before the
grant, arrives. Stored as it was, it showed that slice free again while the store counted it a
reservation member's: for a moment the queue saw one slice beyond what the reservation held and
granted it to a researcher the window should have kept waiting.
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone
from typing import Any

from calque.models.session import Slice, SliceState
from calque.session.broker.hosts import HostCache


def _slice(n: int, session: str | None = None) -> dict[str, Any]:
    s = Slice(id=f"MIG-{n}", kind="mig", gpu_index=0, gpu_uuid="GPU-0", profile="1g.5gb", mig_uuid=f"MIG-{n}")
    return SliceState(slice=s, busy=session is not None, session_id=session).model_dump(mode="json")


class _Host:
    """One host's answers to the broker (the link is the boundary: what the daemon would say). A list
    can be made to wait, between the host's answer and its arrival, for a grant to land."""

    def __init__(self) -> None:
        self.slices = [_slice(1), _slice(2)]
        self.answered = threading.Event()
        self.go_on = threading.Event()
        self.hold_next_list = False

    def call(self, op: str, args: dict[str, Any], *, request_id: str, as_user: str | None = None) -> Any:
        assert op == "list", op
        answer = list(self.slices)
        if self.hold_next_list:
            self.hold_next_list = False
            self.answered.set()
            assert self.go_on.wait(30), "the test never let the list's answer arrive"
        return answer


def _busy(cache: HostCache) -> dict[str, str | None]:
    (view,) = cache.views()
    return {s.slice.id: s.session_id for s in view.slices if s.busy}


def test_a_list_answered_before_a_grant_does_not_show_its_slice_free_again() -> None:
    host = _Host()
    cache = HostCache({"hostA": host})
    cache.refresh("hostA")
    assert _busy(cache) == {}

    # A poll's list is answered (both slices free), then a grant lands before the answer is stored.
    host.hold_next_list = True
    poll = threading.Thread(target=cache.refresh, args=("hostA",))
    poll.start()
    assert host.answered.wait(30)
    until = datetime.now(timezone.utc) + timedelta(hours=1)
    host.slices = [_slice(1, "s-member"), _slice(2)]  # what the host did
    cache.taken("hostA", "MIG-1", "s-member", until)
    assert _busy(cache) == {"MIG-1": "s-member"}
    host.go_on.set()
    poll.join(30)
    assert not poll.is_alive()
    # The stale answer did not free it, nor call the session ended.
    assert _busy(cache) == {"MIG-1": "s-member"}
    (view,) = cache.views()
    assert next(s for s in view.slices if s.slice.id == "MIG-1").busy_until == until

    # The next list, asked after the grant, is the host's word again: it shows the session itself...
    _, ended = cache.refresh("hostA")
    assert _busy(cache) == {"MIG-1": "s-member"} and ended == set()
    # ...and once it ended there, the slice is free and the session reported ended, not kept busy.
    host.slices = [_slice(1), _slice(2)]
    _, ended = cache.refresh("hostA")
    assert _busy(cache) == {} and ended == {"s-member"}


def test_a_grant_marked_before_a_list_was_asked_is_the_lists_to_report() -> None:
    """A mark older than the list is not re-applied: a session that ended right after its grant is
    free at the next list, not kept busy by the broker's memory of granting it."""
    host = _Host()
    cache = HostCache({"hostA": host})
    cache.refresh("hostA")
    cache.taken("hostA", "MIG-2", "s-short", datetime.now(timezone.utc) + timedelta(seconds=1))
    assert _busy(cache) == {"MIG-2": "s-short"}
    _, ended = cache.refresh("hostA")  # the host: it already ended
    assert _busy(cache) == {} and ended == {"s-short"}

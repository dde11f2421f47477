"""Generator methods in the warm supervisor: their values reach a chunk sink in order, while they run."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from calque.models import Item
from calque.warm import WarmSupervisor, WorkloadError
from support.waits import HANG_S, until

SCRIPT = (
    f"HANG_S = {HANG_S!r}\n"
    + """
import asyncio, threading, time, modal
app = modal.App("gens")
GO = threading.Event()
ENDED = threading.Event()

@app.cls()
class Gens:
    @modal.method()
    def waits(self, n):
        yield "first"
        if not GO.wait(HANG_S):  # released by the test once it has the first chunk
            raise TimeoutError("the first value never reached the sink while the method ran")
        yield from range(n)

    @modal.method()
    def breaks(self, n):
        yield from range(n)
        raise KeyError("gone")

    @modal.method(is_generator=True)
    async def agen(self, n):
        for i in range(n):
            await asyncio.sleep(0)
            yield i * 10

    @modal.method()
    def forever(self):
        try:
            i = 0
            while True:
                yield i
                i += 1
                time.sleep(0.02)
        finally:
            ENDED.set()

    @modal.method()
    def plain(self, x):
        return x
"""
)


@pytest.fixture
def sup(tmp_path: Path):
    script = tmp_path / "gens.py"
    script.write_text(SCRIPT)
    with WarmSupervisor.load(f"{script}::Gens") as s:
        yield s


def _sink() -> tuple[list[tuple[int, int, list[Any]]], Any]:
    got: list[tuple[int, int, list[Any]]] = []
    return got, lambda index, number, values: got.append((index, number, values))


def test_a_value_reaches_the_sink_before_the_generator_ends(sup: WarmSupervisor) -> None:
    got, sink = _sink()
    go = sup.workload.methods["waits"].fn.__func__.__globals__["GO"]  # the script's own event
    result: list[Any] = []
    item = Item(index=3, args=[4])
    t = threading.Thread(target=lambda: result.extend(sup.drain("waits", [item], on_chunk=sink).results))
    t.start()
    until(lambda: got, "the first chunk reaches the sink", every=0.05)
    assert got[:1] == [(3, 1, ["first"])]  # flushed on its own, while the method waits
    go.set()
    t.join(HANG_S)
    (r,) = result
    assert r.ok and r.value == {"chunks": len(got), "values": 5}
    assert [n for _, n, _ in got] == list(range(1, len(got) + 1))
    assert [v for _, _, vs in got for v in vs] == ["first", 0, 1, 2, 3]


def test_an_exception_mid_stream_keeps_the_values_before_it(sup: WarmSupervisor) -> None:
    got, sink = _sink()
    (r,) = sup.drain("breaks", [Item(index=0, args=[3])], on_chunk=sink).results
    assert not r.ok and r.error is not None and r.error.type == "KeyError"
    assert [v for _, _, vs in got for v in vs] == [0, 1, 2]


def test_async_generators_stream_and_without_a_sink_the_value_is_the_list(sup: WarmSupervisor) -> None:
    got, sink = _sink()
    (r,) = sup.drain("agen", [Item(index=0, args=[3])], on_chunk=sink).results
    assert r.ok and [v for _, _, vs in got for v in vs] == [0, 10, 20]
    assert sup.run("agen", [Item(index=0, args=[2])])[0].value == [0, 10]
    assert sup.run("plain", [Item(index=0, args=[7])])[0].value == 7


def test_a_batched_generator_is_refused_at_load(tmp_path: Path) -> None:
    script = tmp_path / "bg.py"
    script.write_text(
        "import modal\napp = modal.App()\n@app.cls()\nclass B:\n    @modal.batched(max_batch_size=4, wait_ms=10)\n"
        "    def g(self, xs):\n        yield xs\n"
    )
    with pytest.raises(WorkloadError, match="both batched and a generator"):
        WarmSupervisor.load(f"{script}::B")


def test_a_timed_out_sync_generator_writes_nothing_more_and_is_closed(tmp_path: Path) -> None:
    script = tmp_path / "gens.py"
    script.write_text(SCRIPT)
    with WarmSupervisor.load(f"{script}::Gens", item_timeout_s=0.5) as s:
        ended = s.workload.methods["forever"].fn.__func__.__globals__["ENDED"]
        got, sink = _sink()
        (r,) = s.drain("forever", [Item(index=0)], on_chunk=sink).results
        assert not r.ok and r.error is not None and r.error.type == "TimeoutError"
        kept = len(got)
        values = [v for _, _, vs in got for v in vs]
        assert values and values == list(range(len(values)))  # the values before the timeout, in order
        assert [n for _, n, _ in got] == list(range(1, kept + 1))
        # Its thread cannot be interrupted, but its next value ends it: the generator's finally ran,
        # and nothing reached the sink after the item's result.
        assert ended.wait(HANG_S), "the timed-out generator kept running"
        threading.Event().wait(0.3)
        assert len(got) == kept

"""Submitting at scale and through faults: streamed staging, refused items, failed claims visible per item."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator

from calque.aws.clients import client
from calque.aws.queue import PoolQueue
from calque.aws.store import CLAIM_FAILED, RunStore
from calque.cli.main import run
from calque.models import Item, QueueSettings
from calque.pool.submitter.stage import StagedClaim, stage_run

from pool.conftest import RUN_WAIT, wait_until


def _cli(capsys, args: list[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = run(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_items_json_cannot_carry_are_refused_with_their_line(moto, capsys, tmp_path) -> None:
    for bad in ("NaN", "[1, Infinity]", '{"args": [-Infinity]}', "1e400"):
        items = tmp_path / "i.jsonl"
        items.write_text(f'1\n"two"\n{bad}\n')
        code, _, err = _cli(capsys, ["pool", "submit", "--model", "m", "--items", str(items), "--bucket", "bkt"])
        assert code == 2, bad
        assert "line 3 is not JSON" in err and ("not a JSON number" in err or "beyond a double's range" in err), err


def test_an_items_file_that_is_not_utf8_gets_a_one_line_error(moto, capsys, tmp_path) -> None:
    items = tmp_path / "latin1.jsonl"
    items.write_bytes('"ok"\n"caf\u00e9"\n'.encode("latin-1"))
    code, _, err = _cli(capsys, ["pool", "submit", "--model", "m", "--items", str(items), "--bucket", "bkt"])
    assert code == 2
    assert err.count("\n") == 1 and "is not UTF-8 text (line 2" in err and "Traceback" not in err


def test_claims_are_sent_while_the_items_are_still_being_produced(moto) -> None:
    s3, sqs = client("s3"), client("sqs")
    s3.create_bucket(Bucket="calque-test-bucket")
    pq = PoolQueue(sqs, "org/stream")
    pq.ensure(QueueSettings(encryption=False))
    store = RunStore(s3, "calque-test-bucket", "calque", pq.name)
    sent: list[StagedClaim] = []

    def items() -> Iterator[Item]:
        for i in range(30):
            yield Item(index=i, args=[i])
        # the generator has more to give, but first the claims already made must be on the queue
        wait_until(lambda: pq.depth().visible >= 3, RUN_WAIT, "the first claims on the queue before the last item")
        for i in range(30, 35):
            yield Item(index=i, args=[i])

    record = stage_run(pq, store, items(), run_id="run-stream", model="org/stream", method="m", batch_size=10,
                       on_sent=sent.extend)  # fmt: skip
    assert record.claims == ["c00000", "c00001", "c00002", "c00003"] and record.item_count == 35
    assert [(c.first_index, c.count) for c in sent] == [(0, 10), (10, 10), (20, 10), (30, 5)]
    assert store.get_run("run-stream") == record
    assert pq.depth().visible == 4


def test_poisoned_claims_give_every_item_a_failed_result(make_pool, capsys, tmp_path) -> None:
    pool = make_pool()
    pool.start()
    items = tmp_path / "i.jsonl"
    items.write_text("".join(f"{i}\n" for i in range(12)))
    base = ["--model", pool.model, "--bucket", pool.bucket]
    wrong = ["--workload-digest", "sha256:not-this-one"]
    code, out, err = _cli(capsys, ["pool", "submit", *base, "--items", str(items), "--batch-size", "5", *wrong,
                                   "--timeout", str(RUN_WAIT), "--json"])  # fmt: skip
    assert code == 1, err
    report = json.loads(out)
    assert report["finished"] and report["items_failed"] == 12 and report["claims_failed"] == 3
    code, out, err = _cli(capsys, ["pool", "results", report["run_id"], *base, "--failed"])
    assert code == 0, err  # every item has a result: none is "missing"
    failed = [json.loads(line) for line in out.splitlines()]
    assert [f["index"] for f in failed] == list(range(12))
    assert all(f["error"]["type"] == CLAIM_FAILED and "sha256:not-this-one" in f["error"]["message"] for f in failed)
    code, out, err = _cli(capsys, ["pool", "status", *base, "--run", report["run_id"]])
    assert code == 0, err
    assert "items: 0 ok, 12 failed of 12" in out and out.count("claim error: c0000") == 3 and "not-this-one" in out


class _Outage:
    """A loopback TCP forwarder to the moto server that can go down (connections dropped) and come back."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        self.down = threading.Event()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            if self.down.is_set():
                conn.close()
                continue
            up = socket.create_connection(self.upstream)
            for a, b in ((conn, up), (up, conn)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def test_waiting_submitter_rides_out_an_endpoint_outage(make_pool, moto) -> None:
    from calque.pool.submitter import submit as core

    pool = make_pool()
    record = pool.submit([1, 2, 3], method="work")
    outage = _Outage(moto)
    store = RunStore(client("s3", endpoint_url=outage.url), pool.bucket, "calque", pool.queue.name)
    outage.down.set()
    threading.Timer(8.0, outage.down.clear).start()  # longer than botocore's own retries ride out
    pool.start()
    rep = core.wait(store, record, timeout_s=RUN_WAIT)
    assert rep.finished and rep.items_ok == 3


def test_a_dead_lettered_claim_lists_its_items_as_failed(make_pool, capsys) -> None:
    pool = make_pool()
    pool.queue.ensure(QueueSettings(visibility_timeout=30, receive_wait=1, max_receive_count=1, encryption=False))
    record = pool.submit([1, 2, 3], method="work")
    sqs, url = client("sqs"), pool.queue.url()
    # a worker that took the claim and died without a Summary; SQS then dead-letters it on the next receive
    assert sqs.receive_message(QueueUrl=url, VisibilityTimeout=0).get("Messages")
    assert not sqs.receive_message(QueueUrl=url, VisibilityTimeout=0).get("Messages")
    assert pool.queue.depth().dlq_visible == 1
    base = ["--model", pool.model, "--bucket", pool.bucket]
    code, out, err = _cli(capsys, ["pool", "results", record.run_id, *base, "--failed"])
    assert code == 0, err
    failed = [json.loads(line) for line in out.splitlines()]
    assert [f["index"] for f in failed] == [0, 1, 2]
    assert all("dead-lettered" in f["error"]["message"] for f in failed)
    assert pool.queue.depth().dlq_visible == 0
    code, out, _ = _cli(capsys, ["pool", "status", *base, "--run", record.run_id])
    assert code == 0 and "items: 0 ok, 3 failed of 3" in out and "dead-lettered: received" in out

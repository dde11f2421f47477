"""The checkout options the institution's queue carries (issue 39): on a host of the institution,
``checkout --gpu N`` waits in the broker's queue, in its order, for a slice of that GPU of that host
and no other; ``run``/``shell --anywhere --lab`` queue and bill under the lab named, one whose groups
the user is in, as ``checkout --anywhere --lab`` does.

Real session daemons (one host of two simulated A100s), a real broker over their sockets, real
second Unix users."""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Callable
from typing import Any

from support.waits import HANG_S

from .conftest import CLI, Host, User, as_user, wait_for
from .institution import Broker, stand_in_ssh
from .test_queue_door import checkout, door, queued_hosts


def _views(b: Broker) -> list[dict[str, Any]]:
    res = b.cli(None, "session", "list", "--all", "--json")
    assert res.returncode == 0, res.stderr
    views: list[dict[str, Any]] = json.loads(res.stdout)
    return views


def _free_gpus(b: Broker, host: str) -> set[int]:
    """The GPUs of ``host`` with a free slice, as the broker last listed it."""
    return {
        st["slice"]["gpu_index"]
        for v in _views(b)
        if v["name"] == host and v["reachable"]
        for st in v["slices"]
        if not st["busy"]
    }


def _queued(b: Broker, user: User) -> list[dict[str, Any]]:
    return [e for e in b.queue_all() if e["user"] == user.name and e["state"] == "queued"]


def _waiting(h: Host, b: Broker, user: User, *extra: str) -> subprocess.Popen[str]:
    """A plain ``checkout --wait`` on ``h`` as ``user``, in the background (its place in the queue)."""
    env = {**h.env, "CALQUE_SESSION_SOCKET": str(h.socket), "CALQUE_BROKER_SOCKET": str(b.socket)}
    cmd = [*h.python, "-c", CLI, "session", "checkout", "--profile", "1g.5gb", "--ttl", "1h", "--wait", "--json"]
    return subprocess.Popen(as_user(user, [*cmd, *extra]), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=h.dir)  # fmt: skip


def _granted(p: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = p.communicate(timeout=HANG_S)
    assert p.returncode == 0, err
    session: dict[str, Any] = json.loads(out)
    return session


def test_a_gpu_checkout_waits_its_turn_in_the_queue_for_that_gpu_only(make_user: Callable[..., User]) -> None:
    holder0, holder1, early, pinned, late = (make_user() for _ in range(5))
    with queued_hosts(make_user, 30.0, {"hostA": 1}, gpus=2) as b:
        h = b.hosts["hostA"]
        assert wait_for(lambda: door(h)["mode"] == "queue")
        assert wait_for(lambda: _free_gpus(b, "hostA") == {0, 1})

        # A GPU the host has no slices on: refused before anything is queued, naming the ones it has.
        res = checkout(h, b, early, "--gpu", "7", "--wait")
        assert res.returncode == 2 and "hostA has no GPU 7" in res.stderr, res.stderr
        assert "its GPUs with slices: 0, 1" in res.stderr, res.stderr
        res = h.cli(
            early, "session", "checkout", "--profile", "7g.40gb", "--gpu", "1", "--broker-socket", str(b.socket)
        )
        assert res.returncode == 2, res.stderr
        assert "hostA offers no MIG slice of profile 7g.40gb on GPU 1; it offers: 1g.5gb (hostA, gpu 0)" in res.stderr
        assert b.queue_all() == []

        # Through the queue (no longer refused by the client), each on the GPU it names.
        held = {}
        for gpu, user in ((0, holder0), (1, holder1)):
            res = checkout(h, b, user, "--gpu", str(gpu))
            assert res.returncode == 0, res.stderr
            held[gpu] = json.loads(res.stdout)
            assert held[gpu]["gpu_index"] == gpu
        first = _waiting(h, b, early)  # any slice of hostA, first in line
        try:
            assert wait_for(lambda: bool(_queued(b, early)))
            second = _waiting(h, b, pinned, "--gpu", "1")
            try:
                assert wait_for(lambda: bool(_queued(b, pinned)))
                [entry] = _queued(b, pinned)
                assert (entry["host"], entry["gpu"], entry["position"]) == ("hostA", 1, 2), entry
                # GPU 1's slice frees: the earlier request takes it; the GPU 1 request waits behind it.
                assert h.cli(holder1, "session", "checkin", held[1]["id"]).returncode == 0
                took = _granted(first)
                assert (took["user"], took["slice_id"]) == (early.name, held[1]["slice_id"])
                assert _queued(b, pinned)[0]["position"] == 1
                # GPU 0's slice frees: not the GPU 1 request's, and no reason to turn a later plain
                # checkout away (the one waiting does not want it): it goes to the first who asks.
                assert h.cli(holder0, "session", "checkin", held[0]["id"]).returncode == 0
                assert wait_for(lambda: 0 in _free_gpus(b, "hostA"))
                res = checkout(h, b, late)
                assert res.returncode == 0, res.stderr
                assert json.loads(res.stdout)["slice_id"] == held[0]["slice_id"]
                assert [e["gpu"] for e in _queued(b, pinned)] == [1]  # still waiting, for GPU 1
                # GPU 1 frees again: the GPU 1 request's turn, on GPU 1.
                assert h.cli(early, "session", "checkin", took["id"]).returncode == 0
                got = _granted(second)
                assert (got["user"], got["gpu_index"], got["slice_id"]) == (pinned.name, 1, held[1]["slice_id"])
            finally:
                second.kill()
        finally:
            first.kill()
        checkouts = [(e["user"], e["gpu"], e["door"]) for e in h.audit_events() if e.get("event") == "checkout"]
        order = [(holder0, 0), (holder1, 1), (early, 1), (late, 0), (pinned, 1)]
        assert checkouts == [(u.name, gpu, "broker") for u, gpu in order]


def test_run_and_shell_anywhere_queue_and_bill_under_the_lab_named(make_user: Callable[..., User]) -> None:
    vision, nlp = "cqv" + secrets.token_hex(3), "cqn" + secrets.token_hex(3)
    holder, both = make_user([vision]), make_user([vision, nlp])  # her default lab is vision (the first)
    labs = [{"name": "vision", "groups": [vision]}, {"name": "nlp", "groups": [nlp]}]
    with queued_hosts(make_user, 30.0, {"hostA": 1, "hostB": 1}, labs=labs) as b:
        env, log = stand_in_ssh(b)
        env["SHELL"] = "/bin/true"  # the shell `shell` starts on the granted host: one that ends at once

        def calque(user: User, *args: str) -> subprocess.CompletedProcess[str]:
            cmd = as_user(user, [*b.python, "-c", CLI, *args])
            return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=HANG_S, cwd=b.dir)

        assert wait_for(lambda: all(v["reachable"] for v in _views(b)) and len(_views(b)) == 2)
        # A lab not of one's groups, or no such lab: refused before anything is checked out.
        res = calque(holder, "session", "run", "--anywhere", "--lab", "nlp", "--ttl", "1h", "--", "/bin/true")
        assert res.returncode == 4 and "none of lab nlp's groups" in res.stderr, res.stderr
        res = calque(both, "session", "shell", "--anywhere", "--lab", "robotics", "--ttl", "1h")
        assert res.returncode == 4 and "no lab robotics" in res.stderr, res.stderr
        res = calque(both, "session", "run", "--lab", "nlp", "--", "/bin/true")
        assert res.returncode == 2 and "go with --anywhere" in res.stderr, res.stderr
        assert b.queue_all() == [] and log.read_text() == ""

        # Every slice held: `shell --anywhere --wait --lab nlp` queues under nlp.
        grants = [b.anywhere(holder, "--profile", "1g.5gb") for _ in range(2)]
        refs = [f"{g['session']['id']}@{g['host']}" for g in grants]
        waiting = ["session", "shell", "--anywhere", "--lab", "nlp", "--profile", "1g.5gb", "--ttl", "1h", "--wait"]
        shell = subprocess.Popen(as_user(both, [*b.python, "-c", CLI, *waiting]), env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, cwd=b.dir)  # fmt: skip
        try:
            assert wait_for(lambda: [e["lab"] for e in _queued(b, both)] == ["nlp"]), b.queue_all()
            assert b.cli(holder, "session", "checkin", refs[0]).returncode == 0
            _, err = shell.communicate(timeout=HANG_S)
            assert shell.returncode == 0, err
        finally:
            shell.kill()
        # `run --anywhere --lab nlp`: granted on the other host once it frees, the command run there.
        assert b.cli(holder, "session", "checkin", refs[1]).returncode == 0
        assert wait_for(lambda: _free_gpus(b, grants[1]["host"]) == {0})
        res = calque(both, "session", "run", "--anywhere", "--lab", "nlp", "--ttl", "1h", "--", "/bin/true")
        assert res.returncode == 0, res.stderr
        went = [line.split()[1] for line in log.read_text().splitlines()]
        assert sorted(went) == ["hostA", "hostB"], went  # one session on each host, each entered there
        billed = {(e.user, e.lab, name) for name, h in b.hosts.items() for e in h.client().ledger("1h").events}
        assert {(lab, name) for who, lab, name in billed if who == both.name} == {("nlp", "hostA"), ("nlp", "hostB")}
        assert {lab for who, lab, _ in billed if who == holder.name} == {"vision"}

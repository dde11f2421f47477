"""The institution's hub as a caller of the broker (issue 36, part 1): named in ``institution.yaml``,
it may ask for a slice for a named user, see and cancel her requests, and nothing else in anyone's
name; no one else may name another user. A real broker and host daemon, created Unix users (the hub's
service user among them), each request made by that user's own process on the broker's socket."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from typing import Any

import pytest
from support.waits import HANG_S

from .conftest import User, wait_for
from .conftest import as_user as as_user_cmd
from .institution import Broker, institution, over_tcp

pytestmark = pytest.mark.slow

ASK = """
import json, sys
from calque.errors import CalqueError
from calque.session.client.broker import BrokerClient
op, args, as_user = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3] or None
try:
    print(json.dumps({"ok": BrokerClient(as_user=as_user).call(op, args)}))
except CalqueError as e:
    print(json.dumps({"error": str(e), "exit": e.exit_code}))
"""


def _ask(broker: Broker, who: User, op: str, args: dict[str, Any], as_user: str = "") -> dict[str, Any]:
    p = broker.popen_script(who, ASK, op, json.dumps(args), as_user)
    out, err = p.communicate(timeout=HANG_S)
    assert p.returncode == 0, err
    doc: dict[str, Any] = json.loads(out)
    return doc


def _audit(broker: Broker) -> list[dict[str, Any]]:
    path = broker.dir / "audit/broker-audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_the_hub_asks_for_a_users_slice_and_no_one_else_names_another_user(make_user: Callable[..., User]) -> None:
    with institution(make_user, {"hostA": 2}) as broker:
        hub, alice, bob = make_user(), make_user(), make_user()
        broker.write_institution(hub={"service_user": hub.name})
        broker.start()
        # The hub, for alice: her slice, her session on the host, her request in her queue.
        g = _ask(broker, hub, "anywhere", {"ttl": "1h", "request_id": "hub-req-0001"}, alice.name)["ok"]
        assert g["session"]["user"] == alice.name and g["session"]["uid"] == alice.uid
        # Bob cannot name anyone, for any op; the hub cannot use anyone's name beyond its few ops.
        for op, args in (("anywhere", {"ttl": "1h", "request_id": "bob-as-alice"}), ("queue", {})):
            refused = _ask(broker, bob, op, args, alice.name)
            assert refused["exit"] == 4 and bob.name in refused["error"] and "hub" in refused["error"], refused
        for op, args in (
            ("on_host", {"ref": f"{g['session']['id']}@hostA", "op": "checkin"}),
            ("nudge", {"host": "hostA"}),
        ):
            refused = _ask(broker, hub, op, args, alice.name)
            assert refused["exit"] == 4 and op in refused["error"], refused
        # Every request in someone's name is audited, granted or refused.
        events = _audit(broker)
        asked = [e for e in events if e["event"] == "hub_request"]
        refusals = [e for e in events if e["event"] == "hub_refused"]
        assert {(e["user"], e["as_user"], e["op"]) for e in asked} == {(hub.name, alice.name, "anywhere")}
        assert {e["user"] for e in refusals} == {bob.name, hub.name} and len(refusals) == 4
        # The hub cancels her queued request for her (a second one, waiting: the host has two slices).
        broker.anywhere(bob)
        waiting = broker.popen_script(
            hub, ASK, "anywhere", json.dumps({"ttl": "1h", "wait": True, "request_id": "hub-req-0002"}), alice.name
        )
        try:
            assert wait_for(lambda: any(e["id"] == "hub-req-0002" for e in broker.queue_all()))
            [place] = _ask(broker, hub, "queue", {}, alice.name)["ok"]  # hers alone, with her place
            assert place["id"] == "hub-req-0002" and place["user"] == alice.name and place["position"] == 1
            assert _ask(broker, hub, "cancel", {"id": "hub-req-0002"}, alice.name).get("ok") is not None
            out, _ = waiting.communicate(timeout=HANG_S)
            assert "error" in json.loads(out)
        finally:
            if waiting.poll() is None:
                waiting.kill()
                waiting.wait()


ASK_TCP = """
import json, sys
from pathlib import Path
from calque.errors import CalqueError
from calque.session.client.broker import BrokerClient
op, args, as_user, institution = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3] or None, Path(sys.argv[4])
client = BrokerClient.here(Path("/nonexistent/broker.sock"), institution)  # not on this host: TCP with munge
assert client.remote is not None
client.as_user = as_user
try:
    print(json.dumps({"ok": client.call(op, args)}))
except CalqueError as e:
    print(json.dumps({"error": str(e), "exit": e.exit_code}))
"""


def test_over_tcp_munge_says_who_the_hub_is(make_user: Callable[..., User]) -> None:
    with institution(make_user, {"hostA": 1}) as broker:
        hub, alice, bob = make_user(), make_user(), make_user()
        with over_tcp(broker, hub=hub.name):
            broker.start()
            env = {**broker.cli_env(), "CALQUE_MUNGE_SOCKET": str(broker.dir / "munge-hosts/munge.socket")}
            inst = str(broker.dir / "institution.yaml")

            def ask(who: User, op: str, args: dict[str, Any], as_user: str = "") -> dict[str, Any]:
                cmd = as_user_cmd(who, [*broker.python, "-c", ASK_TCP, op, json.dumps(args), as_user, inst])
                res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=HANG_S, cwd=broker.dir)
                assert res.returncode == 0, res.stderr
                doc: dict[str, Any] = json.loads(res.stdout)
                return doc

            refused = ask(bob, "anywhere", {"ttl": "1h", "request_id": "bob-as-alice-tcp"}, alice.name)
            assert refused["exit"] == 4 and bob.name in refused["error"] and alice.name in refused["error"], refused
            g = ask(hub, "anywhere", {"ttl": "1h", "request_id": "hub-tcp-00001"}, alice.name)["ok"]
            assert g["session"]["user"] == alice.name and g["host"] == "hostA"
            refused = ask(hub, "ledger", {}, alice.name)
            assert refused["exit"] == 4 and "ledger" in refused["error"], refused

"""The host daemon's ``notebook`` capability (issue 36, part 1): the host's one command, as the
session's user, in the session's cgroup, only for the session's own user or the institution's hub
acting for her; audited. Real munged, a real daemon on TCP, created Unix users: the hub's service
user, the holder, and a second user trying every abuse.

The host's command here is a stand-in single-user server (stdlib ``http.server``) that answers with
what it is: its uid, its cgroup, its environment and argv; the hub's real server is the spawner's test.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.waits import HANG_S

from .conftest import Host, User, wait_for
from .munged import Munged
from .test_crosshost import Door
from .test_isolation import _gone, cgroup_parent  # noqa: F401 (a fixture)

pytestmark = pytest.mark.slow

SERVER = """
import http.server, json, os, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        me = {"uid": os.getuid(), "groups": os.getgroups(), "cgroup": open("/proc/self/cgroup").read(),
              "env": dict(os.environ), "argv": sys.argv, "cwd": os.getcwd()}
        body = json.dumps(me).encode()
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer((sys.argv[1], int(sys.argv[2])), H).serve_forever()
"""


def _door(host: Host, munged: Munged, hub: User, cgroups: Path) -> Door:
    command = [*host.python, "-c", SERVER, "{ip}", "{port}"]
    return Door(host, munged, hub_user=hub.name, cgroup_parent=str(cgroups), cgroups="direct", notebook_command=command)


def _facts(ip: str, port: int) -> dict[str, Any]:
    def answer() -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"http://{ip}:{port}/", timeout=HANG_S) as r:
                doc: dict[str, Any] = json.loads(r.read())
                return doc
        except OSError:
            return None

    got: list[dict[str, Any]] = []
    assert wait_for(lambda: bool(got.append(a) or True) if (a := answer()) is not None else False), "no server"
    return got[0]


def _started(host: Host) -> list[dict[str, Any]]:
    return [e for e in host.audit_events() if e["event"] == "notebook"]


def test_the_hub_starts_her_server_as_her_in_her_session_and_it_ends_with_it(
    host: Host,
    munged: Munged,
    make_user: Callable[..., User],
    cgroup_parent: Path,  # noqa: F811
) -> None:
    hub, alice = make_user(), make_user()
    home = Path(pwd.getpwnam(alice.name).pw_dir)  # her server's log lives there (made here: useradd -M)
    home.mkdir(parents=True)
    os.chown(home, alice.uid, alice.gid)
    door = _door(host, munged, hub, cgroup_parent)
    s = door.call(alice, "checkout", {"profile": "1g.5gb", "ttl": "1h"}, rid="a" * 16)["ok"]
    hub_env = {"JUPYTERHUB_API_TOKEN": "hub-token", "JUPYTERHUB_SERVICE_PREFIX": f"/user/{alice.name}/"}
    got = door.call(hub, "notebook", {"id": s["id"], "env": hub_env}, as_user=alice.name, rid="n" * 16)["ok"]
    assert got["user"] == alice.name and got["session_id"] == s["id"] and got["ip"] == "127.0.0.1"
    me = _facts(got["ip"], got["port"])
    assert me["uid"] == alice.uid  # as her: not root, not the hub
    assert me["cgroup"].strip().endswith(f"/{s['id']}")  # in her session's cgroup
    assert me["env"]["CUDA_VISIBLE_DEVICES"] == s["slice_id"] and me["env"]["CALQUE_SESSION_ID"] == s["id"]
    assert me["env"]["CALQUE_SESSION_EXPIRES"] and me["env"]["JUPYTERHUB_API_TOKEN"] == "hub-token"
    assert me["argv"][1:] == ["127.0.0.1", str(got["port"])]  # the host's command, the daemon's address
    [audited] = _started(host)
    assert audited["via"] == "hub" and audited["session"] == s["id"] and audited["pid"] == got["pid"]
    # She may start one herself, in her own session (the capability is hers already: `session run`).
    own = door.call(alice, "notebook", {"id": s["id"]}, rid="o" * 16)["ok"]
    assert _facts(own["ip"], own["port"])["uid"] == alice.uid and _started(host)[-1]["via"] == "self"
    # Part 2: the session's warnings reach the server's log (an admin's drain moves its end in: a notice).
    log = Path(got["log"])
    assert log == home / ".local/state/calque" / f"notebook-{s['id']}.log" and log.stat().st_uid == alice.uid
    host.cli(None, "session", "drain", "--by", "30s", "--reason", "maintenance", check=True)
    assert wait_for(lambda: "[calque session]" in log.read_text()), "no notice in the server's log"
    assert f"session {s['id']}" in log.read_text() and "ends in" in log.read_text()
    # The session's end ends both servers: they live in its cgroup.
    assert door.call(alice, "checkin", {"id": s["id"]}, rid="c" * 16).get("ok")
    assert wait_for(lambda: _gone(got["pid"]) and _gone(own["pid"])), "a notebook server outlived its session"
    shutil.rmtree(home)


def test_no_one_can_turn_the_capability_into_anything_else(
    host: Host,
    munged: Munged,
    make_user: Callable[..., User],
    cgroup_parent: Path,  # noqa: F811
) -> None:
    hub, alice, bob = make_user(), make_user(), make_user()
    door = _door(host, munged, hub, cgroup_parent)
    s = door.call(alice, "checkout", {"profile": "1g.5gb", "ttl": "1h"}, rid="a" * 16)["ok"]
    sid = s["id"]

    def refused(answer: dict[str, Any], exit_code: int, *words: str) -> None:
        assert "error" in answer and answer["exit"] == exit_code, answer
        for w in words:
            assert w in answer["message"], answer

    # Bob, as himself: not in her session, not as her, not another command, not another environment.
    refused(door.call(bob, "notebook", {"id": sid}, rid="b1" * 8), 4, "not yours")
    refused(door.call(bob, "notebook", {"id": sid}, as_user=alice.name, rid="b2" * 8), 4, bob.name, alice.name)
    refused(door.call(bob, "notebook", {"id": sid, "command": ["/bin/sh"]}, rid="b3" * 8), 2, "command")
    for name in ("LD_PRELOAD", "PATH", "PYTHONPATH", "CUDA_VISIBLE_DEVICES"):
        refused(door.call(alice, "notebook", {"id": sid, "env": {name: "x"}}, rid="b4" * 8), 2, name)
    # The hub acts for a user only for her notebook, her sessions and her check-in, and only in her
    # own session: not checkouts or extensions in her name, not her session as Bob, not as root.
    for op, args in (("checkout", {"profile": "1g.5gb"}), ("extend", {"id": sid, "by": "1h"}), ("adopt", {})):
        refused(door.call(hub, op, args, as_user=alice.name, rid="h1" * 8), 4, "hub", op)
    refused(door.call(hub, "notebook", {"id": sid}, as_user=bob.name, rid="h2" * 8), 4, "not yours")
    refused(door.call(hub, "notebook", {"id": sid}, as_user="root", rid="h3" * 8), 4, "not yours")
    refused(door.call(hub, "notebook", {"id": sid}, rid="h4" * 8), 4, "not yours")  # the hub for itself
    assert _started(host) == []  # nothing ran
    refusals = [e for e in host.audit_events() if e["event"] == "remote_refused"]
    assert {e["reason"] for e in refusals} >= {"acts_for_another", "hub_op"}
    # The hub's allowed few work in her name: her sessions, her check-in.
    mine = door.call(hub, "status", as_user=alice.name, rid="h5" * 8)["ok"]
    assert [x["id"] for x in mine] == [sid]
    assert door.call(hub, "checkin", {"id": sid}, as_user=alice.name, rid="h6" * 8)["ok"]["id"] == sid
    # Her ended session by id, with how it ended (the hub's poll says why); to no one else, hub or not.
    [ended] = door.call(hub, "status", {"id": sid}, as_user=alice.name, rid="h7" * 8)["ok"]
    assert ended["id"] == sid and ended["end_reason"] == "checkin" and ended["ended_at"]
    assert door.call(bob, "status", {"id": sid}, rid="b5" * 8)["ok"] == []
    assert door.call(hub, "status", {"id": sid}, as_user=bob.name, rid="h8" * 8)["ok"] == []

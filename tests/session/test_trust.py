"""What crosses the socket, in both directions: the client trusts only the service, the daemon only
typed requests, and usage comes from the registry, not from a log anyone could have written."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest

from .conftest import CLI, Host, User, as_user

pytestmark = pytest.mark.slow

FAKE_DAEMON = """
import json, os, socket, sys
path, pwned = sys.argv[1], sys.argv[2]
env = {
    "CUDA_VISIBLE_DEVICES": f"$(touch {pwned})",
    f"X=1; touch {pwned}; Y": "1",
    "PATH": "/nonexistent",
}
session = {"version": 1, "id": "s-fake", "slice_id": "MIG-x", "kind": "mig", "profile": "1g.5gb", "gpu_index": 0,
           "uid": os.getuid(), "gid": os.getgid(), "user": "x", "created_at": "2026-12-01T00:00:00Z",
           "expires_at": "2026-12-01T01:00:00Z", "env": env}
reply = (json.dumps({"version": 1, "ok": True, "result": session}) + "\\n").encode()
s = socket.socket(socket.AF_UNIX)
s.bind(path)
os.chmod(path, 0o777)
s.listen(8)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    try:
        c.recv(65536)
        c.sendall(reply)
    except OSError:
        pass
    c.close()
"""


def _wrapper(host: Host) -> dict[str, str]:
    """An environment where ``calque`` in bash is this checkout's CLI."""
    wrapper = host.dir / "bin/calque"
    if not wrapper.exists():
        wrapper.parent.mkdir(mode=0o755)
        wrapper.write_text(f'#!/bin/sh\nexec {" ".join(host.python)} -c "$CALQUE_CLI" "$@"\n')
        wrapper.chmod(0o755)
    return {**host.env, "PATH": f"{wrapper.parent}:{host.env['PATH']}", "CALQUE_CLI": CLI}


def _fake_daemon(host: Host, owner: User, where: Path, pwned: Path) -> subprocess.Popen[str]:
    where.mkdir(mode=0o755)
    os.chown(where, owner.uid, owner.gid)
    script = host.dir / "fake_daemon.py"
    script.write_text(FAKE_DAEMON)
    proc = subprocess.Popen(
        as_user(owner, [*host.python, str(script), str(where / "fake.sock"), str(pwned)]),
        env=host.env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def test_fake_daemon_cannot_run_a_command_through_shell_eval(host: Host, make_user: Callable[..., User]) -> None:
    alice, mallory = make_user(), make_user()
    pwned = host.dir / "pwned"
    fake = _fake_daemon(host, mallory, host.dir / "mallory", pwned)
    try:
        env = {**_wrapper(host), "CALQUE_SESSION_SOCKET": str(host.dir / "mallory/fake.sock")}
        script = 'eval "$(calque session checkout --shell)"; echo "cvd=$CUDA_VISIBLE_DEVICES"'
        res = host.run_as(alice, ["/bin/bash", "-c", script], env=env)
        # Another user's process at the socket: refused before anything is sent or believed.
        assert f"runs as uid {mallory.uid}, not root or the session service user" in res.stderr, res.stderr
        assert "cvd=\n" in res.stdout and not pwned.exists()
    finally:
        fake.kill()
        fake.wait(10)


def test_shell_exports_only_known_names_quoted_even_from_a_trusted_answer(
    host: Host, make_user: Callable[..., User]
) -> None:
    # Alice's own "daemon" passes the peer check (it could do nothing she could not): still, --shell
    # sets only calque's variable names, each value quoted, so nothing in the answer is executed.
    alice = make_user()
    pwned = host.dir / "pwned"
    fake = _fake_daemon(host, alice, host.dir / "alice", pwned)
    try:
        env = {**_wrapper(host), "CALQUE_SESSION_SOCKET": str(host.dir / "alice/fake.sock")}
        script = 'eval "$(calque session checkout --shell)"; echo "cvd=$CUDA_VISIBLE_DEVICES"; echo "path=$PATH"'
        res = host.run_as(alice, ["/bin/bash", "-c", script], env=env)
        assert res.returncode == 0, res.stderr
        assert f"cvd=$(touch {pwned})" in res.stdout and "path=/nonexistent" not in res.stdout
        assert "not exporting 2 variable(s)" in res.stderr
        assert not pwned.exists()
    finally:
        fake.kill()
        fake.wait(10)


def _raw_as(host: Host, user: User, line: str) -> dict[str, object]:
    code = (
        "import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); "
        "s.sendall(sys.argv[2].encode() + b'\\n'); print(s.recv(65536).decode())"
    )
    res = host.run_as(user, [*host.python, "-c", code, str(host.socket), line], check=True)
    return json.loads(res.stdout)  # type: ignore[no-any-return]


def test_misspelled_argument_is_refused_by_name(host: Host, make_user: Callable[..., User]) -> None:
    alice = make_user()
    host.start()
    cases = {
        "tll": '{"version": 1, "op": "checkout", "args": {"tll": "1m"}}',
        "consent": '{"version": 1, "op": "checkout", "args": {"mps": true, "consent": "yes"}}',
        "ttl": '{"version": 1, "op": "checkout", "args": {"ttl": NaN}}',
        "gpu": '{"version": 1, "op": "checkout", "args": {"gpu": [[[0]]]}}',
        "by": '{"version": 1, "op": "extend", "args": {"by": Infinity}}',
        "force": '{"version": 1, "op": "release", "args": {"id": "s-1", "force": 1}}',
    }
    for field, line in cases.items():
        resp = _raw_as(host, alice, line)
        err = resp["error"]
        assert resp["ok"] is False and isinstance(err, dict), resp
        assert err["kind"] == "usage" and err["message"].startswith("bad arguments to"), resp
        assert f"change {field}" in err["message"], resp
    deep = '{"version": 1, "op": "checkout", "args": {"ttl": ' + "[" * 5000 + "]" * 5000 + "}}"
    resp = _raw_as(host, alice, deep)
    assert resp["ok"] is False and resp["error"]["kind"] == "protocol", resp  # type: ignore[index]
    # Nothing was checked out by any of them, and the daemon still serves.
    assert json.loads(host.cli(alice, "session", "status", "--json", check=True).stdout) == []
    assert _raw_as(host, alice, '{"version": 1, "op": "ping"}')["ok"] is True


def test_report_reads_the_usage_table_not_the_audit_log(host: Host, make_user: Callable[..., User]) -> None:
    alice, bob = make_user(), make_user()
    host.start()
    for u in (alice, bob):
        host.cli(u, "session", "checkout", "--ttl", "10m", check=True)
        host.cli(u, "session", "checkin", check=True)
    forged = {"event": "checkout", "session": "s-forged", "uid": bob.uid, "user": bob.name, "kind": "mig",
              "profile": "1g.5gb", "ts": "2026-01-01T00:00:00+00:00"}  # fmt: skip
    with host.audit.open("a") as f:
        f.write(json.dumps(forged) + "\n")
    host.audit.rename(host.audit.with_name("rotated.jsonl"))  # and the log gone: the report is unchanged

    def rows(user: User | None) -> list[tuple[str, int, float]]:
        rep = json.loads(host.cli(user, "session", "report", "--since", "1d", "--json", check=True).stdout)
        return [(r["user"], r["sessions"], r["gpu_hours"]) for r in rep["rows"]]

    everyone = rows(None)  # root: an admin
    assert sorted(u for u, _, _ in everyone) == sorted([alice.name, bob.name])
    assert all(n == 1 and h < 0.1 for _, n, h in everyone), everyone
    assert [u for u, _, _ in rows(alice)] == [alice.name]  # a user sees only her own usage
    assert [u for u, _, _ in rows(bob)] == [bob.name]


def test_env_after_extend_shows_the_new_deadline(host: Host, make_user: Callable[..., User]) -> None:
    alice = make_user()
    host.start()
    s = json.loads(host.cli(alice, "session", "checkout", "--ttl", "10m", "--json", check=True).stdout)
    ext = json.loads(host.cli(alice, "session", "extend", "--by", "20m", "--json", check=True).stdout)
    assert ext["env"]["CALQUE_SESSION_EXPIRES"] != s["env"]["CALQUE_SESSION_EXPIRES"]
    out = host.cli(alice, "session", "env", "--shell", check=True).stdout
    line = next(x for x in out.splitlines() if x.startswith("export CALQUE_SESSION_EXPIRES="))
    shown = datetime.fromisoformat(line.split("=", 1)[1].strip("'"))
    assert shown == datetime.fromisoformat(ext["expires_at"].replace("Z", "+00:00"))
    assert (shown - datetime.fromisoformat(s["expires_at"].replace("Z", "+00:00"))).total_seconds() == 1200


def test_protocol_versions_are_strict_integers_and_a_huge_ttl_is_a_usage_error(
    host: Host, make_user: Callable[..., User]
) -> None:
    alice = make_user()
    host.start()
    for version in ('"1"', '"2"', "1.0", "2.0", "2", "true"):
        resp = _raw_as(host, alice, f'{{"version": {version}, "op": "ping"}}')
        assert resp["ok"] is False and resp["error"]["kind"] == "protocol", (version, resp)  # type: ignore[index]
    newer = _raw_as(host, alice, '{"version": 2, "op": "ping"}')
    assert "newer" in newer["error"]["message"]  # type: ignore[index]
    assert _raw_as(host, alice, '{"version": 1, "op": "ping"}')["ok"] is True
    huge = "9" * 401
    for op, arg in (("checkout", "ttl"), ("extend", "by"), ("report", "since")):
        resp = _raw_as(host, alice, f'{{"version": 1, "op": "{op}", "args": {{"{arg}": {huge}}}}}')
        assert resp["ok"] is False and resp["error"]["kind"] == "usage", (op, resp)  # type: ignore[index]
        assert f"change {arg}" in resp["error"]["message"]  # type: ignore[index]
    assert host.audit_events() == []  # nothing was checked out

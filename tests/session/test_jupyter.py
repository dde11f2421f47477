"""``calque session jupyter`` (issue 36, part 4): a created user's JupyterLab runs inside her session's
cgroup on a real daemon, answers on 127.0.0.1 behind its token, and ends when she checks in.

The server is real (the ``notebooks`` extra, part of ``dev``); the user reaches it by the printed URL.
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from support.waits import HANG_S

from .conftest import CLI, Host, User, as_user, wait_for
from .institution import institution, stand_in_ssh
from .test_isolation import _gone, cgroup_parent  # noqa: F401 (a fixture)

pytestmark = pytest.mark.slow

URL = re.compile(r"http://127\.0\.0\.1:(\d+)/lab\?token=([0-9a-f]+)")


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=HANG_S) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, b""
    except OSError:
        return 0, b""


def _home(host: Host, user: User) -> Path:
    """A home of her own: Jupyter keeps its runtime files (connection files, the server's) under it."""
    home = host.dir / f"home-{user.name}"
    home.mkdir()
    subprocess.run(["chown", f"{user.uid}:{user.gid}", str(home)], check=True)
    return home


def test_jupyter_runs_in_the_session_behind_its_token_and_ends_with_it(
    host: Host,
    make_user: Callable[..., User],
    cgroup_parent: Path,  # noqa: F811
) -> None:
    alice = make_user()
    host.start(cgroup_parent=str(cgroup_parent), cgroups="direct")
    s = json.loads(host.cli(alice, "session", "checkout", "--json", check=True).stdout)
    env = {**host.env, "CALQUE_SESSION_SOCKET": str(host.socket), "HOME": str(_home(host, alice))}
    cmd = [*host.python, "-c", CLI, "session", "jupyter", "--tunnel-host", "gpu7.example.edu"]
    lab = subprocess.Popen(as_user(alice, cmd), env=env, cwd=host.dir, stderr=subprocess.PIPE, text=True)
    try:
        assert lab.stderr is not None
        said = []
        while not (url := URL.search("".join(said))):
            line = lab.stderr.readline()
            assert line, f"jupyter exited before printing its URL: {''.join(said)}"
            said.append(line)
        port, token = int(url.group(1)), url.group(2)
        printed = "".join(said)
        assert f"ssh -N -L {port}:127.0.0.1:{port} gpu7.example.edu" in printed
        assert s["id"] in printed
        # The server answers on 127.0.0.1 once it is up; its API wants the token.
        assert wait_for(lambda: _get(f"http://127.0.0.1:{port}/api")[0] == 200), "JupyterLab never answered"
        status, body = _get(f"http://127.0.0.1:{port}/api/status?token={token}")
        assert status == 200 and "started" in json.loads(body)
        assert _get(f"http://127.0.0.1:{port}/api/status")[0] == 403  # without the token: refused
        # One character changed, to one it is not (a token may itself start with "0").
        forged = ("1" if token[0] == "0" else "0") + token[1:]
        assert _get(f"http://127.0.0.1:{port}/api/status?token={forged}")[0] == 403
        # It is the adopted CLI process itself (exec'd), in the session's cgroup, as alice, with the
        # session's environment (kernels and terminals inherit it); the token is not on its command line.
        cg = cgroup_parent / s["id"]
        assert lab.pid in [int(p) for p in (cg / "cgroup.procs").read_text().split()]
        assert Path(f"/proc/{lab.pid}").stat().st_uid == alice.uid
        environ = dict(kv.split("=", 1) for kv in Path(f"/proc/{lab.pid}/environ").read_text().split("\0") if "=" in kv)
        assert environ["CALQUE_SESSION_ID"] == s["id"]
        assert environ["CUDA_VISIBLE_DEVICES"] == s["slice_id"]
        assert "CALQUE_SESSION_EXPIRES" in environ
        assert token not in Path(f"/proc/{lab.pid}/cmdline").read_text()
        assert "--ServerApp.ip=127.0.0.1" in Path(f"/proc/{lab.pid}/cmdline").read_text().split("\0")
        # Check-in kills the session's cgroup: the server goes with it.
        host.cli(alice, "session", "checkin", s["id"], check=True)
        assert wait_for(lambda: _gone(lab.pid)), "JupyterLab outlived the session's check-in"
        lab.wait(HANG_S)
        assert _get(f"http://127.0.0.1:{port}/api")[0] == 0
    finally:
        if lab.poll() is None:
            lab.kill()
            lab.wait()


def test_jupyter_without_a_session_says_so_and_starts_nothing(host: Host, make_user: Callable[..., User]) -> None:
    alice = make_user()
    host.start()
    res = host.cli(alice, "session", "jupyter")
    assert res.returncode == 2 and "you hold no session" in res.stderr, res.stderr
    assert "token=" not in res.stderr


def test_jupyter_anywhere_starts_on_the_granted_host_and_names_it_in_the_tunnel(
    make_user: Callable[..., User],
    cgroup_parent: Path,  # noqa: F811
) -> None:
    """``--anywhere``: a slice through the broker, then ``ssh -t HOST calque session jupyter`` there (the
    transport stood in as in test_broker_front_tcp.py; calque on the host is the real CLI and daemon)."""
    with institution(make_user, {"hostA": 1}) as broker:
        h = broker.hosts["hostA"]
        h.stop()
        h.start(cgroup_parent=str(cgroup_parent), cgroups="direct")
        broker.write_institution()
        broker.start()
        alice = make_user()
        env, log = stand_in_ssh(broker)
        env["HOME"] = str(_home(h, alice))
        cmd = [*broker.python, "-c", CLI, "session", "jupyter", "--anywhere", "--ttl", "1h"]
        lab = subprocess.Popen(as_user(alice, cmd), env=env, cwd=broker.dir, stderr=subprocess.PIPE, text=True)
        try:
            assert lab.stderr is not None
            said = []
            while not (url := URL.search("".join(said))):
                line = lab.stderr.readline()
                assert line, f"jupyter exited before printing its URL: {''.join(said)}"
                said.append(line)
            port = int(url.group(1))
            sid = next(w for line in said for w in line.split() if w.startswith("s-") and w.endswith("@hostA:"))
            sid = sid.split("@")[0]
            assert f"ssh -N -L {port}:127.0.0.1:{port} hostA" in "".join(said)
            assert log.read_text().split()[:2] == ["-t", "hostA"]
            assert wait_for(lambda: _get(f"http://127.0.0.1:{port}/api")[0] == 200), "JupyterLab never answered"
            # JupyterLab runs in the session's cgroup on hostA (the remote calque, adopted, became it)
            procs = (cgroup_parent / sid / "cgroup.procs").read_text().split()
            assert any("jupyterlab" in Path(f"/proc/{p}/cmdline").read_text() for p in procs), procs
            # Checked in from anywhere (through the broker): the server on hostA ends with the session.
            res = broker.cli(alice, "session", "checkin", f"{sid}@hostA")
            assert res.returncode == 0, res.stderr
            lab.wait(HANG_S)
            assert _get(f"http://127.0.0.1:{port}/api")[0] == 0
        finally:
            if lab.poll() is None:
                lab.kill()
                lab.wait()

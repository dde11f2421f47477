"""The daemon's files under attack, as munged's would be: unsafe directories, planted files and
symlinks, a held lock, a dangling socket symlink; and the audit log that must follow logrotate."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from support.waits import HANG_S

from .conftest import Host, User, as_user, wait_for

pytestmark = pytest.mark.slow


def _refused(host: Host, **overrides: object) -> str:
    """Start the daemon expecting it to refuse; the log it left."""
    with pytest.raises(AssertionError, match="daemon exited") as info:
        host.start(**overrides)
    return str(info.value)


@pytest.mark.parametrize("which", ["state", "log", "socket"])
def test_daemon_refuses_a_world_writable_state_log_or_socket_directory(host: Host, which: str) -> None:
    # State and log directories apart from the socket's (host.dir), so each check is seen on its own.
    other = Path(tempfile.mkdtemp(prefix="calque-files-", dir="/tmp"))
    try:
        other.chmod(0o755)
        paths = {"db": str(other / "state/sessions.db"), "audit_log": str(other / "log/audit.jsonl")}
        bad = {"state": other / "state", "log": other / "log", "socket": host.dir}[which]
        bad.mkdir(mode=0o755, exist_ok=True)
        bad.chmod(0o777)
        log = _refused(host, **paths)
        assert f"{bad} is group- or world-writable (mode 0777)" in log and "chmod go-w" in log, log
        bad.chmod(0o755)  # fixed as the message says: it starts
        host.start(**paths)
    finally:
        shutil.rmtree(other, ignore_errors=True)


def test_daemon_refuses_a_state_directory_another_user_owns(host: Host, make_user: Callable[..., User]) -> None:
    mallory = make_user()
    state = host.dir / "state"
    state.mkdir(mode=0o700)
    os.chown(state, mallory.uid, mallory.gid)
    log = _refused(host)
    assert f"{state} is owned by uid {mallory.uid}, not root" in log, log
    assert not (state / "sessions.db").exists()


def test_registry_audit_and_lock_files_are_private_including_wal_and_shm(
    host: Host, make_user: Callable[..., User]
) -> None:
    alice = make_user()
    host.start()
    host.cli(alice, "session", "checkout", "--ttl", "10m", check=True)
    state = host.dir / "state"
    files = [state / "sessions.db", state / "sessions.db-wal", state / "sessions.db-shm", host.audit]
    files += sorted((state / "locks").iterdir())
    assert len(files) == 6, files
    for f in files:
        st = f.lstat()
        assert stat.S_ISREG(st.st_mode) and st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o600, f
    assert stat.S_IMODE((state / "locks").stat().st_mode) == 0o700
    for f in files:
        assert host.run_as(alice, ["/usr/bin/test", "-r", str(f)]).returncode != 0, f


def test_wal_and_shm_left_world_readable_by_an_older_calque_are_made_private(host: Host) -> None:
    host.start()
    host.stop()
    state = host.dir / "state"
    for name in ("sessions.db", "sessions.db-wal", "sessions.db-shm"):
        if (state / name).exists():
            (state / name).chmod(0o644)
    host.start()
    for name in ("sessions.db", "sessions.db-wal", "sessions.db-shm"):
        assert stat.S_IMODE((state / name).stat().st_mode) == 0o600, name


@pytest.mark.parametrize("name", ["sessions.db", "sessions.db-wal"])
def test_planted_sessions_db_symlink_is_refused(host: Host, make_user: Callable[..., User], name: str) -> None:
    mallory = make_user()
    target = host.dir / "mallory-owns-this"
    target.write_text("")
    os.chown(target, mallory.uid, mallory.gid)
    target.chmod(0o644)
    state = host.dir / "state"
    state.mkdir(mode=0o700)
    (state / name).symlink_to(target)
    log = _refused(host)
    assert f"{state / name} is not safe: it is a symlink" in log, log
    # Neither followed (nothing written, no chmod) nor replaced.
    st = target.stat()
    assert st.st_uid == mallory.uid and stat.S_IMODE(st.st_mode) == 0o644 and st.st_size == 0
    assert (state / name).is_symlink()


def test_planted_audit_log_is_refused(host: Host, make_user: Callable[..., User]) -> None:
    mallory = make_user()
    forged = {"event": "checkout", "session": "s-forged", "uid": 4242, "user": "victim", "ts": "2026-01-01T00:00Z"}
    host.audit.write_text(json.dumps(forged) + "\n")
    os.chown(host.audit, mallory.uid, mallory.gid)
    log = _refused(host)
    assert f"audit log {host.audit} is not safe: it is owned by uid {mallory.uid}" in log, log
    os.chown(host.audit, 0, 0)
    host.audit.chmod(0o666)  # root's, but anyone could have written to it
    log = _refused(host)
    assert "it is writable by others (mode 0666)" in log, log


def test_a_user_holding_the_old_write_lock_file_cannot_hang_checkouts(
    host: Host, make_user: Callable[..., User]
) -> None:
    # An older calque kept its lock beside the database; a user who could open it once may hold a
    # descriptor (and a flock) on it forever. The daemon now locks files in a 0700 directory.
    mallory, alice = make_user(), make_user()
    state = host.dir / "state"
    state.mkdir(mode=0o755)
    old = state / "sessions.db.write.lock"
    old.write_text("")
    old.chmod(0o644)
    hold = f"import fcntl, time; f = open({str(old)!r}); fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); "
    hold += "time.sleep(1e6)"  # until killed: a checkout waiting on it would wait past any ceiling here
    holder = subprocess.Popen(
        as_user(mallory, [*host.python, "-c", hold]),
        env=host.env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        host.start()
        res = host.cli(alice, "session", "checkout", "--ttl", "5m")  # done at all: not waiting on her lock
        assert res.returncode == 0, res.stderr
        new_lock = state / "locks/sessions.db.write.lock"
        assert host.run_as(mallory, ["/usr/bin/test", "-r", str(new_lock)]).returncode != 0
    finally:
        holder.kill()
        holder.wait(HANG_S)


def test_dangling_symlink_at_the_socket_path_is_cleared_at_start(host: Host) -> None:
    host.socket.symlink_to(host.dir / "nowhere")
    host.start()
    assert stat.S_ISSOCK(host.socket.lstat().st_mode)
    assert host.client().call("ping") == {"pong": True}


def test_a_regular_file_at_the_socket_path_is_refused_with_a_message(host: Host) -> None:
    host.socket.write_text("not a socket")
    log = _refused(host)
    assert f"socket path {host.socket} is taken by something that is not a socket" in log, log
    assert host.socket.read_text() == "not a socket"


def test_audit_log_follows_rotation_and_stays_private(host: Host, make_user: Callable[..., User]) -> None:
    alice = make_user()
    host.start()
    host.cli(alice, "session", "checkout", "--ttl", "5m", check=True)
    rotated = host.audit.with_name(host.audit.name + ".1")
    host.audit.rename(rotated)  # what logrotate does (nocreate: the daemon makes the new file)
    host.cli(alice, "session", "checkin", check=True)
    assert wait_for(lambda: host.audit.exists())
    assert [e["event"] for e in host.audit_events()] == ["checkin"]
    assert [json.loads(x)["event"] for x in rotated.read_text().splitlines()] == ["checkout"]
    st = host.audit.stat()
    assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o600

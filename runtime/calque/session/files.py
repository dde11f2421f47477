"""The daemon's own files, checked the way munged checks its key, socket and log.

The daemon starts only when every directory it writes in (state, log, socket) is owned by a trusted
user (root or the daemon's own user) and writable by nobody else, and each ancestor is either the same
or sticky (``/tmp``). Because no one else can create, rename or remove names in those directories,
everything the daemon opens there afterwards is what it created: no planted file, symlink or hard
link. Files are opened with ``O_NOFOLLOW`` and checked by ``fstat`` all the same (defence in depth),
created 0600 under umask 077, and never ``chmod``-ed through a path.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from calque.errors import RefusedError

PRIVATE_UMASK = 0o077
# Groups below this are system groups (login.defs' SYS_GID_MAX is 999 on Debian, Ubuntu and RHEL):
# one of them may share write access to a directory above the daemon's, never to the daemon's own.
SYSTEM_GID_MAX = 1000


class UnsafePathError(RefusedError):
    """A file or directory the daemon would trust is reachable by other users: it refuses to start."""


def trusted_uids() -> frozenset[int]:
    """Owners the daemon trusts: root and the user it runs as (a service user, or a test's own user)."""
    return frozenset({0, os.geteuid()})


def _fix(path: Path, what: str) -> str:
    return (
        f"{what} {path} is not safe: {{why}}; fix it with `chown root: {path} && chmod go-w {path}` "
        "(or point the session config somewhere private)"
    )


def check_directory(path: Path, what: str) -> None:
    """Refuse unless ``path`` and every directory above it is owned by a trusted user and not
    writable by others (ancestors may be sticky and root-owned, like /tmp, or writable by a system
    group, like Ubuntu's /var/log)."""
    ok_uids = trusted_uids()
    path = Path(os.path.abspath(path))
    msg = _fix(path, what)
    # A symlink on the way is only as safe as its owner (it can be replaced by no one else: its
    # directory is checked too); the real directories behind it are checked through realpath.
    for part in [path, *path.parents]:
        try:
            st = os.lstat(part)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode) and st.st_uid not in ok_uids:
            raise UnsafePathError(msg.format(why=f"{part} is a symlink owned by uid {st.st_uid}"))
    real = Path(os.path.realpath(path))
    for i, part in enumerate([real, *real.parents]):
        st = os.stat(part)
        if not stat.S_ISDIR(st.st_mode):
            raise UnsafePathError(msg.format(why=f"{part} is not a directory"))
        if st.st_uid not in ok_uids:
            raise UnsafePathError(msg.format(why=f"{part} is owned by uid {st.st_uid}, not root"))
        writable_by_others = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if i > 0 and not st.st_mode & stat.S_IWOTH and st.st_gid < SYSTEM_GID_MAX:
            writable_by_others = 0  # Ubuntu's /var/log is root:syslog 0775: a system group, not users
        if writable_by_others and (i == 0 or not (st.st_mode & stat.S_ISVTX and st.st_uid == 0)):
            mode = stat.S_IMODE(st.st_mode)
            raise UnsafePathError(msg.format(why=f"{part} is group- or world-writable (mode {mode:04o})"))


def private_directory(path: Path, what: str, mode: int = 0o700) -> None:
    """Create ``path`` (and missing parents) with ``mode`` when absent, then check it and its parents."""
    missing = [p for p in [path, *path.parents] if not os.path.lexists(p)]
    for p in reversed(missing):
        try:
            os.mkdir(p, mode)
            os.chmod(p, mode)  # mkdir's mode passes through the umask; a socket directory needs 0755
        except FileExistsError:
            pass  # another worker made it first; it is checked below like any other
    check_directory(path, what)


def _check_open_file(fd: int, path: Path, what: str, created: bool) -> None:
    st = os.fstat(fd)
    msg = _fix(path, what)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePathError(msg.format(why="it is not a regular file"))
    if st.st_uid not in trusted_uids():
        raise UnsafePathError(
            msg.format(why=f"it is owned by uid {st.st_uid}: someone else created it; move it away and restart")
        )
    if st.st_nlink != 1:
        raise UnsafePathError(msg.format(why=f"it has {st.st_nlink} hard links; move it away and restart"))
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not created:
        raise UnsafePathError(
            msg.format(why=f"it is writable by others (mode {stat.S_IMODE(st.st_mode):04o}); it may have been edited")
        )


def open_private(path: Path, flags: int, what: str, mode: int = 0o600, tighten: bool = True) -> int:
    """Open (creating 0600) a file the daemon owns, never through a symlink; refuse one that is not a
    regular file of a trusted owner with a single link. ``tighten`` drops read access for others on an
    existing file (an older calque created some 0644) through the descriptor, never through the path."""
    created = False
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_CREAT | os.O_EXCL, mode)
        created = True
    except FileExistsError:
        try:
            fd = os.open(path, (flags & ~os.O_CREAT) | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            why = "it is a symlink" if os.path.islink(path) else (exc.strerror or str(exc))
            raise UnsafePathError(_fix(path, what).format(why=why)) from exc
    try:
        _check_open_file(fd, path, what, created)
        if tighten and stat.S_IMODE(os.fstat(fd).st_mode) & 0o077:
            os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def secure_existing(path: Path, what: str) -> None:
    """A file SQLite will open by name (the database, its -wal and -shm): if present, it must pass the
    same checks as ``open_private`` (and is made 0600 through a descriptor)."""
    if not os.path.lexists(path):
        return
    os.close(open_private(path, os.O_RDONLY, what))


def lock_path(db: Path, name: str) -> Path:
    """Lock files live in a 0700 directory of the state directory: no other user can open (and
    ``flock``) them, whatever their mode, and a descriptor kept from an older layout locks nothing."""
    return db.parent / "locks" / f"{db.name}.{name}.lock"


def prepare_socket(path: Path) -> None:
    """Make the socket's directory (0755: users must reach the socket) and clear a stale entry.

    The directory is checked first, so only a trusted user can have put anything at the path: a stale
    socket or a symlink (dangling or not) is unlinked (``unlink`` never follows), anything else is
    refused with a message rather than half-started."""
    private_directory(path.parent, "socket directory", mode=0o755)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISSOCK(st.st_mode) or stat.S_ISLNK(st.st_mode):
        os.unlink(path)
        return
    raise UnsafePathError(
        f"socket path {path} is taken by something that is not a socket; move it away or set `socket:` elsewhere"
    )

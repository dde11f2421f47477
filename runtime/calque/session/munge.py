"""Munge credentials through libmunge (ctypes): what vouches for a caller's uid and gid across hosts.

``encode`` asks the local munged for a credential carrying a payload; the credential names the
calling process's uid and gid, which munged learns from the kernel, so no process can make one for
another uid (root on a keyed host can: munge's trust is every host holding the institution's key).
``decode`` asks the local munged to check one: it refuses a credential made with another key, one
past its time to live, and one it has already decoded (its replay cache), and reports which.

Importable by the client, the broker and the host daemon alike: nothing here knows any of them.
Each call makes its own libmunge context (contexts are not to be shared between threads).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path

from calque.errors import InfrastructureError

DEFAULT_MUNGE_SOCKET = Path("/run/munge/munge.socket.2")
MUNGE_OPT_TTL = 4
MUNGE_OPT_SOCKET = 8


class MungeStatus(IntEnum):
    """munge.h's munge_err_t."""

    SUCCESS = 0
    SNAFU = 1
    BAD_ARG = 2
    BAD_LENGTH = 3
    OVERFLOW = 4
    NO_MEMORY = 5
    SOCKET = 6
    TIMEOUT = 7
    BAD_CRED = 8
    BAD_VERSION = 9
    BAD_CIPHER = 10
    BAD_MAC = 11
    BAD_ZIP = 12
    BAD_REALM = 13
    CRED_INVALID = 14
    CRED_EXPIRED = 15
    CRED_REWOUND = 16
    CRED_REPLAYED = 17
    CRED_UNAUTHORIZED = 18


# What the credential's holder did wrong (refuse it), as opposed to munged failing (a host problem).
CREDENTIAL_FAULTS = frozenset(
    {
        MungeStatus.BAD_CRED,
        MungeStatus.BAD_VERSION,
        MungeStatus.BAD_CIPHER,
        MungeStatus.BAD_MAC,
        MungeStatus.BAD_ZIP,
        MungeStatus.BAD_REALM,
        MungeStatus.CRED_INVALID,
        MungeStatus.CRED_EXPIRED,
        MungeStatus.CRED_REWOUND,
        MungeStatus.CRED_REPLAYED,
        MungeStatus.CRED_UNAUTHORIZED,
        MungeStatus.BAD_LENGTH,
        MungeStatus.BAD_ARG,  # decode's: no credential at all
    }
)


class MungeError(InfrastructureError):
    """libmunge said no; ``status`` says why (``status in CREDENTIAL_FAULTS``: the credential's fault)."""

    def __init__(self, status: MungeStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Decoded:
    uid: int
    gid: int
    payload: bytes


_lib: ctypes.CDLL | None = None
_libc: ctypes.CDLL | None = None
_lock = threading.Lock()


def _load() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    global _lib, _libc
    with _lock:
        if _lib is None or _libc is None:
            try:
                lib = ctypes.CDLL("libmunge.so.2")
            except OSError as exc:
                raise InfrastructureError(f"libmunge is not installed (libmunge.so.2: {exc}); install munge") from exc
            lib.munge_ctx_create.restype = ctypes.c_void_p
            lib.munge_ctx_create.argtypes = []
            lib.munge_ctx_destroy.restype = None
            lib.munge_ctx_destroy.argtypes = [ctypes.c_void_p]
            lib.munge_ctx_set.restype = ctypes.c_int
            # variadic: no argtypes, each argument passed as the ctypes type munge.h gives that option
            lib.munge_ctx_strerror.restype = ctypes.c_char_p
            lib.munge_ctx_strerror.argtypes = [ctypes.c_void_p]
            lib.munge_strerror.restype = ctypes.c_char_p
            lib.munge_strerror.argtypes = [ctypes.c_int]
            lib.munge_encode.restype = ctypes.c_int
            lib.munge_encode.argtypes = [
                ctypes.POINTER(ctypes.c_void_p),
                ctypes.c_void_p,
                ctypes.c_char_p,
                ctypes.c_int,
            ]
            lib.munge_decode.restype = ctypes.c_int
            lib.munge_decode.argtypes = [
                ctypes.c_char_p,
                ctypes.c_void_p,
                ctypes.POINTER(ctypes.c_void_p),
                ctypes.POINTER(ctypes.c_int),
                ctypes.POINTER(ctypes.c_uint),
                ctypes.POINTER(ctypes.c_uint),
            ]
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            libc.free.restype = None
            libc.free.argtypes = [ctypes.c_void_p]
            _lib, _libc = lib, libc
        return _lib, _libc


def _status(rc: int) -> MungeStatus:
    try:
        return MungeStatus(rc)
    except ValueError:
        return MungeStatus.SNAFU


class _Context:
    """One libmunge context for one call, on ``socket`` (munged's), destroyed after."""

    def __init__(self, socket: Path | None) -> None:
        self.lib, self.libc = _load()
        self.ctx = self.lib.munge_ctx_create()
        if not self.ctx:
            raise MungeError(MungeStatus.NO_MEMORY, "libmunge could not make a context")
        self._keep: list[object] = []
        if socket is not None:
            self.set_string(MUNGE_OPT_SOCKET, str(socket))

    def set_string(self, opt: int, value: str) -> None:
        buf = ctypes.c_char_p(value.encode())
        self._keep.append(buf)  # libmunge copies it, but only once munge_ctx_set returned
        self._check(self.lib.munge_ctx_set(ctypes.c_void_p(self.ctx), ctypes.c_int(opt), buf), "set an option")

    def set_int(self, opt: int, value: int) -> None:
        self._check(
            self.lib.munge_ctx_set(ctypes.c_void_p(self.ctx), ctypes.c_int(opt), ctypes.c_int(value)), "set an option"
        )

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise MungeError(_status(rc), f"munge could not {what}: {self.error(rc)}")

    def error(self, rc: int) -> str:
        text = self.lib.munge_ctx_strerror(self.ctx) or self.lib.munge_strerror(rc)
        return text.decode(errors="replace") if text else f"munge error {rc}"

    def close(self) -> None:
        self.lib.munge_ctx_destroy(self.ctx)


def encode(payload: bytes, *, socket: Path | None = None, ttl: int | None = None) -> str:
    """A credential for this process's uid and gid carrying ``payload`` (``ttl`` seconds; munged's
    default when None)."""
    c = _Context(socket)
    try:
        if ttl is not None:
            c.set_int(MUNGE_OPT_TTL, ttl)
        out = ctypes.c_void_p()
        rc = c.lib.munge_encode(ctypes.byref(out), c.ctx, payload, len(payload))
        try:
            if rc != 0:
                where = socket or DEFAULT_MUNGE_SOCKET
                raise MungeError(_status(rc), f"cannot make a munge credential (munged at {where}): {c.error(rc)}")
            return ctypes.string_at(out.value).decode("ascii") if out.value else ""
        finally:
            if out.value:
                c.libc.free(out.value)
    finally:
        c.close()


def decode(credential: str, *, socket: Path | None = None) -> Decoded:
    """Check ``credential`` with the local munged; its uid, gid and payload, or MungeError saying why not."""
    c = _Context(socket)
    try:
        buf, size, uid, gid = ctypes.c_void_p(), ctypes.c_int(), ctypes.c_uint(), ctypes.c_uint()
        try:
            raw = credential.encode("ascii")
        except UnicodeEncodeError as exc:
            raise MungeError(MungeStatus.BAD_CRED, "the munge credential is not ASCII") from exc
        rc = c.lib.munge_decode(raw, c.ctx, ctypes.byref(buf), ctypes.byref(size), ctypes.byref(uid), ctypes.byref(gid))
        try:
            payload = ctypes.string_at(buf.value, size.value) if buf.value and size.value > 0 else b""
            if rc != 0:
                raise MungeError(_status(rc), f"munge credential refused: {c.error(rc)}")
            return Decoded(uid=uid.value, gid=gid.value, payload=payload)
        finally:
            if buf.value:
                c.libc.free(buf.value)  # libmunge allocates the payload even for an expired or replayed one
    finally:
        c.close()

"""Munge credentials through libmunge (the library behind Debian's ``munge``/``unmunge``), by ctypes.

A credential is made by the calling process itself, so the local munged vouches for that process's
uid and gid; a host decoding it with the same institution key learns that uid and gid, the payload,
and when it was made. munged refuses a bad, expired or replayed credential (its replay cache) and
this module turns each refusal into a ``MungeError`` naming it.

Why the library and not the binaries: a ``munge`` plus ``unmunge`` pair of processes costs about 3 ms
per request (p50, p99 over 40 ms) on a loaded 2-core machine, the library about 0.1 ms
(``docs/session.md``, "Institution"). The socket
path is configurable (tests run a private munged); None is munged's own default.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from dataclasses import dataclass
from pathlib import Path

from calque.errors import InfrastructureError, RefusedError

# munge.h (0.5.x): the context options and error codes used here.
_OPT_TTL = 4
_OPT_ENCODE_TIME = 6
_OPT_SOCKET = 8
EMUNGE_SOCKET = 6
EMUNGE_TIMEOUT = 7
EMUNGE_BAD_CRED = 8
EMUNGE_CRED_INVALID = 14
EMUNGE_CRED_EXPIRED = 15
EMUNGE_CRED_REWOUND = 16
EMUNGE_CRED_REPLAYED = 17
EMUNGE_CRED_UNAUTHORIZED = 18
_REFUSALS = {
    EMUNGE_BAD_CRED: "bad",
    9: "bad",  # bad version
    10: "bad",  # bad cipher
    11: "bad",  # bad mac
    12: "bad",  # bad zip
    13: "bad",  # bad realm
    EMUNGE_CRED_INVALID: "bad",
    EMUNGE_CRED_EXPIRED: "expired",
    EMUNGE_CRED_REWOUND: "rewound",
    EMUNGE_CRED_REPLAYED: "replayed",
    EMUNGE_CRED_UNAUTHORIZED: "unauthorized",
}


class MungeError(RefusedError):
    """munged refused a credential: ``reason`` is bad, expired, rewound, replayed or unauthorized."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class MungeUnavailable(InfrastructureError):
    """No libmunge, or no munged answering at the socket."""


@dataclass(frozen=True)
class Decoded:
    uid: int
    gid: int
    payload: bytes
    encoded_at: int  # seconds since the epoch, by the encoding host's clock


_lib: ctypes.CDLL | None = None
_libc: ctypes.CDLL | None = None
_load_lock = threading.Lock()


def _library() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    global _lib, _libc
    with _load_lock:
        if _lib is None or _libc is None:
            name = ctypes.util.find_library("munge") or "libmunge.so.2"
            try:
                lib = ctypes.CDLL(name)
            except OSError as exc:
                raise MungeUnavailable(
                    f"cannot load libmunge ({exc}); install munge (Debian/Ubuntu: apt install munge)"
                ) from exc
            p, i = ctypes.c_void_p, ctypes.c_int
            lib.munge_ctx_create.restype = p
            lib.munge_ctx_destroy.argtypes = [p]
            # munge_ctx_set is variadic: no argtypes, each call passes typed ctypes values
            lib.munge_ctx_set.restype = i
            lib.munge_ctx_get.argtypes = [p, i, ctypes.POINTER(ctypes.c_long)]
            lib.munge_ctx_get.restype = i
            lib.munge_encode.argtypes = [ctypes.POINTER(ctypes.c_void_p), p, ctypes.c_char_p, i]
            lib.munge_encode.restype = i
            lib.munge_decode.argtypes = [
                ctypes.c_char_p,
                p,
                ctypes.POINTER(p),
                ctypes.POINTER(i),
                ctypes.POINTER(ctypes.c_uint),
                ctypes.POINTER(ctypes.c_uint),
            ]
            lib.munge_decode.restype = i
            lib.munge_strerror.argtypes = [i]
            lib.munge_strerror.restype = ctypes.c_char_p
            libc = ctypes.CDLL(None)
            libc.free.argtypes = [p]
            _lib, _libc = lib, libc
        return _lib, _libc


def _context(lib: ctypes.CDLL, socket: Path | None) -> int:
    ctx = lib.munge_ctx_create()
    if not ctx:
        raise MungeUnavailable("libmunge could not make a context (out of memory)")
    if (
        socket is not None
        and lib.munge_ctx_set(ctypes.c_void_p(ctx), _OPT_SOCKET, ctypes.c_char_p(str(socket).encode())) != 0
    ):
        lib.munge_ctx_destroy(ctx)
        raise MungeUnavailable(f"libmunge refused the socket path {socket}")
    return int(ctx)


def _where(socket: Path | None) -> str:
    return f"munged at {socket}" if socket is not None else "munged (its default socket)"


def _fail(lib: ctypes.CDLL, rc: int, socket: Path | None, doing: str) -> Exception:
    text = (lib.munge_strerror(rc) or b"error").decode(errors="replace")
    if rc in (EMUNGE_SOCKET, EMUNGE_TIMEOUT):
        return MungeUnavailable(f"cannot {doing}: {_where(socket)}: {text}; is munge.service running?")
    reason = _REFUSALS.get(rc)
    if reason is not None:
        return MungeError(reason, f"{reason} munge credential ({text})")
    return MungeUnavailable(f"cannot {doing}: {_where(socket)}: {text} (munge error {rc})")


def encode(payload: bytes, *, socket: Path | None = None, ttl: int | None = None) -> str:
    """A credential for this process's uid and gid carrying ``payload``, valid for ``ttl`` seconds
    (munged's default, 300 s, when None)."""
    lib, libc = _library()
    ctx = _context(lib, socket)
    cred = ctypes.c_void_p()
    try:
        if ttl is not None and lib.munge_ctx_set(ctypes.c_void_p(ctx), _OPT_TTL, ctypes.c_int(ttl)) != 0:
            raise MungeUnavailable(f"libmunge refused the TTL {ttl}")
        rc = lib.munge_encode(ctypes.byref(cred), ctx, payload, len(payload))
        if rc != 0:
            raise _fail(lib, rc, socket, "make a munge credential")
        assert cred.value is not None
        return ctypes.string_at(cred.value).decode("ascii")
    finally:
        if cred.value:
            libc.free(cred.value)
        lib.munge_ctx_destroy(ctx)


def decode(credential: str, *, socket: Path | None = None) -> Decoded:
    """Who made ``credential`` (uid, gid), its payload and when; MungeError when munged refuses it
    (bad, expired, replayed: a credential decodes once)."""
    lib, libc = _library()
    try:
        raw = credential.encode("ascii")
    except UnicodeEncodeError as exc:
        raise MungeError("bad", "bad munge credential (not ASCII)") from exc
    if b"\0" in raw:
        raise MungeError("bad", "bad munge credential (a NUL byte)")
    ctx = _context(lib, socket)
    buf = ctypes.c_void_p()
    length = ctypes.c_int()
    uid = ctypes.c_uint()
    gid = ctypes.c_uint()
    try:
        rc = lib.munge_decode(raw, ctx, ctypes.byref(buf), ctypes.byref(length), ctypes.byref(uid), ctypes.byref(gid))
        if rc != 0:
            raise _fail(lib, rc, socket, "decode a munge credential")
        payload = ctypes.string_at(buf.value, length.value) if buf.value else b""
        when = ctypes.c_long()
        lib.munge_ctx_get(ctx, _OPT_ENCODE_TIME, ctypes.byref(when))
        return Decoded(uid=uid.value, gid=gid.value, payload=payload, encoded_at=when.value)
    finally:
        if buf.value:
            libc.free(buf.value)
        lib.munge_ctx_destroy(ctx)

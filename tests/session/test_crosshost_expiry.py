"""An expired credential over TCP: a request's own credential made with a time to live of 1 s
(libmunge's MUNGE_OPT_TTL, which calque's encode leaves at munged's default), sent 2 s later:
the host's munged calls it expired; refused, audited, nothing served. The same encode with a time to
live no loaded machine outlasts (HANG_S) is served."""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable

from calque.models.institution import RemoteRequest, binding
from support.waits import HANG_S

from .conftest import Host, User
from .munged import Munged
from .test_crosshost import HOST, Door, _refused

MUNGE_OPT_TTL, MUNGE_OPT_SOCKET = 4, 8


def encode_with_ttl(payload: bytes, socket: str, ttl: int) -> str:
    lib = ctypes.CDLL("libmunge.so.2")
    lib.munge_ctx_create.restype = ctypes.c_void_p
    ctx = ctypes.c_void_p(lib.munge_ctx_create())
    assert lib.munge_ctx_set(ctx, MUNGE_OPT_SOCKET, ctypes.c_char_p(socket.encode())) == 0
    assert lib.munge_ctx_set(ctx, MUNGE_OPT_TTL, ctypes.c_int(ttl)) == 0
    cred = ctypes.c_char_p()
    try:
        assert lib.munge_encode(ctypes.byref(cred), ctx, payload, ctypes.c_int(len(payload))) == 0
        assert cred.value is not None
        return cred.value.decode()
    finally:
        lib.munge_ctx_destroy(ctx)


def test_an_expired_credential_is_refused_and_audited(
    host: Host, munged: Munged, make_user: Callable[..., User]
) -> None:
    alice = make_user()
    door = Door(host, munged)

    def envelope(rid: str, ttl: int) -> dict[str, object]:
        pay = binding("status", {}, rid, HOST, "root", alice.name)
        cred = encode_with_ttl(pay, str(munged.socket), ttl)
        req = RemoteRequest(op="status", request_id=rid, host=HOST, user="root", as_user=alice.name, credential=cred)
        return req.model_dump(mode="json")

    assert door.send_envelope(envelope("f" * 16, int(HANG_S)))["ok"] is True  # within its time to live: served
    late = envelope("e" * 16, 1)
    time.sleep(2.2)
    _refused(door.send_envelope(late), "expired")
    [ev] = door.refusals()
    assert ev["reason"] == "credential_expired" and ev["as_user"] == alice.name

"""calque.session.munge against real munged processes: what a credential vouches for and what is refused."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator

import pytest
from calque.session import munge
from calque.session.munge import MungeError, MungeStatus

from .munged import Munged, munged, new_key

pytestmark = pytest.mark.skipif(shutil.which("munged") is None, reason="munge is not installed")


@pytest.fixture
def md() -> Iterator[Munged]:
    with munged() as m:
        yield m


def test_round_trip_names_this_process(md: Munged) -> None:
    cred = munge.encode(b"payload \x00 binary", socket=md.socket)
    got = munge.decode(cred, socket=md.socket)
    assert (got.uid, got.gid, got.payload) == (os.getuid(), os.getgid(), b"payload \x00 binary")


def test_a_second_host_with_the_same_key_decodes_and_keeps_its_own_replay_cache(md: Munged) -> None:
    with munged(md.key) as other:
        cred = munge.encode(b"x", socket=md.socket)
        assert munge.decode(cred, socket=other.socket).payload == b"x"
        with pytest.raises(MungeError) as exc:
            munge.decode(cred, socket=other.socket)
        assert exc.value.status is MungeStatus.CRED_REPLAYED
        assert "replay" in str(exc.value).lower()


def test_another_key_is_refused(md: Munged) -> None:
    with munged(new_key(md.dir / "forger.key")) as forger:
        cred = munge.encode(b"x", socket=forger.socket)
    with pytest.raises(MungeError) as exc:
        munge.decode(cred, socket=md.socket)
    assert exc.value.status in munge.CREDENTIAL_FAULTS
    assert exc.value.status in (MungeStatus.CRED_INVALID, MungeStatus.BAD_MAC)


def test_garbage_and_non_ascii_are_refused(md: Munged) -> None:
    for bad in ("MUNGE:garbage:", "", "not a credential", "MUNGE:\u00e9:"):
        with pytest.raises(MungeError) as exc:
            munge.decode(bad, socket=md.socket)
        assert exc.value.status in munge.CREDENTIAL_FAULTS, (bad, exc.value.status)


def test_expired(md: Munged) -> None:
    cred = munge.encode(b"x", socket=md.socket, ttl=1)
    time.sleep(2.2)
    with pytest.raises(MungeError) as exc:
        munge.decode(cred, socket=md.socket)
    assert exc.value.status is MungeStatus.CRED_EXPIRED


def test_no_munged_is_a_host_problem_not_a_credential_fault(md: Munged) -> None:
    with pytest.raises(MungeError) as exc:
        munge.encode(b"x", socket=md.dir / "nobody-here.sock")
    assert exc.value.status not in munge.CREDENTIAL_FAULTS
    assert "nobody-here.sock" in str(exc.value)

"""Typed requests, the shell exports and the directory checks, without a daemon."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path
from typing import get_args

import pytest
from calque.models.session import REQUESTS, CheckoutArgs, SessionOp
from calque.session.client.shellenv import EXPORTED_NAMES, shell_exports
from calque.session.daemon.requests import parse_args
from calque.session.daemon.wire import RequestError
from calque.session.files import UnsafePathError, check_directory, open_private


def test_every_protocol_op_has_a_typed_request() -> None:
    assert set(get_args(SessionOp)) <= set(REQUESTS)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ({"tll": "1m"}, "tll"),
        ({"mps": True, "consent": 1}, "consent"),
        ({"mps": "true"}, "mps"),
        ({"gpu": True}, "gpu"),
        ({"gpu": -1}, "gpu"),
        ({"ttl": float("nan")}, "ttl"),
        ({"ttl": float("inf")}, "ttl"),
        ({"ttl": {"h": 1}}, "ttl"),
        ({"profile": "x" * 65}, "profile"),
        ({"request_id": ["a"]}, "request_id"),
    ],
)
def test_bad_checkout_arguments_are_refused_naming_the_field(args: dict[str, object], field: str) -> None:
    with pytest.raises(RequestError) as info:
        parse_args("checkout", args)
    assert info.value.kind == "usage" and f"change {field}" in info.value.message


def test_good_arguments_parse_to_their_types() -> None:
    a = parse_args("checkout", {"mps": True, "consent": True, "ttl": 90, "gpu": 1, "request_id": "r"})
    assert isinstance(a, CheckoutArgs) and a.consent is True and a.ttl == 90.0 and a.gpu == 1
    assert parse_args("report", {}).since == "7d"  # type: ignore[attr-defined]
    with pytest.raises(RequestError, match="unknown operation"):
        parse_args("format_disk", {})


def test_shell_exports_drop_unknown_names_and_quote_values() -> None:
    warned: list[str] = []
    env = {"CUDA_VISIBLE_DEVICES": "$(id)'`x`", "PATH": "/evil", "A=1;id;B": "1", "CALQUE_SESSION_ID": "s-1"}
    out = shell_exports(env, warned.append)
    assert [line.split("=", 1)[0] for line in out.splitlines()] == [
        "export CALQUE_SESSION_ID",
        "export CUDA_VISIBLE_DEVICES",
    ]
    assert "not exporting 2 variable(s)" in warned[0]
    res = subprocess.run(["/bin/sh", "-c", out + '\nprintf %s "$CUDA_VISIBLE_DEVICES"'], capture_output=True, text=True)
    assert res.stdout == env["CUDA_VISIBLE_DEVICES"]
    assert all(shlex.quote(n) == n for n in EXPORTED_NAMES)


def test_directory_checks_refuse_writable_dirs_and_allow_sticky_tmp(tmp_path: Path) -> None:
    d = tmp_path / "state"
    d.mkdir(mode=0o700)
    check_directory(d, "state directory")
    d.chmod(0o770)
    with pytest.raises(UnsafePathError, match="group- or world-writable"):
        check_directory(d, "state directory")
    d.chmod(0o700)
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    inner = sticky / "x"
    inner.mkdir(mode=0o700)
    check_directory(inner, "state directory")  # like /tmp above a private directory
    with pytest.raises(UnsafePathError):
        check_directory(sticky, "state directory")  # but not as the directory itself
    if os.geteuid() != 0:
        return  # the rest gives a directory to other groups
    syslog = tmp_path / "log"  # Ubuntu's /var/log: root:syslog 0775
    syslog.mkdir(mode=0o775)
    os.chown(syslog, 0, 104)
    syslog.chmod(0o775)
    (syslog / "calque").mkdir(mode=0o750)
    check_directory(syslog / "calque", "audit log directory")
    os.chown(syslog, 0, 4242)  # a users' group may not share it
    with pytest.raises(UnsafePathError, match="group- or world-writable"):
        check_directory(syslog / "calque", "audit log directory")


def test_open_private_creates_0600_and_refuses_symlinks_and_hard_links(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        fd = open_private(tmp_path / "f", os.O_RDWR, "registry file")
    finally:
        os.umask(old)
    os.close(fd)
    assert (tmp_path / "f").stat().st_mode & 0o777 == 0o600
    (tmp_path / "link").symlink_to(tmp_path / "f")
    with pytest.raises(UnsafePathError, match="symlink"):
        open_private(tmp_path / "link", os.O_RDWR, "registry file")
    os.link(tmp_path / "f", tmp_path / "hard")
    with pytest.raises(UnsafePathError, match="2 hard links"):
        open_private(tmp_path / "f", os.O_RDWR, "registry file")

"""The institution's munge key on an elastic session host, from the one place its profile may read.

Inventory names an SSM SecureString (``ssm_parameter``, read with decryption) or an S3 object stored
with server-side encryption (``s3_bucket``/``s3_key``; an object S3 reports unencrypted is refused,
so a key copied by hand without SSE is not silently trusted). The key is written 0400, owned by the
``munge`` user when there is one, through a temporary file renamed into place, and never logged.
"""

from __future__ import annotations

import base64
import contextlib
import os
import pwd
from pathlib import Path
from typing import Any

from calque.aws.aws_errors import aws_errors
from calque.errors import RefusedError, UsageError
from calque.models.fleet import MungeKeySource

MIN_KEY_BYTES = 32  # mungekey's own minimum
DEFAULT_KEY_PATH = Path("/etc/munge/munge.key")


def fetch_key(source: MungeKeySource, *, ssm: Any = None, s3: Any = None) -> bytes:
    """The key's bytes. An SSM SecureString holds it base64-encoded (binary does not fit a parameter)."""
    if source.ssm_parameter is not None:
        with aws_errors(f"read the munge key from SSM parameter {source.ssm_parameter}"):
            p = ssm.get_parameter(Name=source.ssm_parameter, WithDecryption=True)["Parameter"]
        if p.get("Type") != "SecureString":
            raise RefusedError(f"SSM parameter {source.ssm_parameter} is a {p.get('Type')}, not a SecureString")
        try:
            key = base64.b64decode(p["Value"], validate=True)
        except ValueError:
            raise UsageError(
                f"SSM parameter {source.ssm_parameter} is not base64 (store base64 of munge.key)"
            ) from None
    else:
        where = f"s3://{source.s3_bucket}/{source.s3_key}"
        with aws_errors(f"read the munge key from {where}"):
            obj = s3.get_object(Bucket=source.s3_bucket, Key=source.s3_key)
            key = obj["Body"].read()
        if not obj.get("ServerSideEncryption"):
            raise RefusedError(f"{where} is stored without server-side encryption: store the key with SSE")
    if len(key) < MIN_KEY_BYTES:
        raise UsageError(f"the munge key is {len(key)} bytes; munge needs at least {MIN_KEY_BYTES}")
    return key


def install_key(key: bytes, path: Path = DEFAULT_KEY_PATH) -> bool:
    """Write ``key`` to ``path`` (0400, the munge user's); False when it is already there, unchanged."""
    with contextlib.suppress(OSError):
        if path.read_bytes() == key:
            return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.calque")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o400)
    with os.fdopen(fd, "wb") as fh:
        fh.write(key)
    with contextlib.suppress(KeyError, PermissionError):
        munge = pwd.getpwnam("munge")
        os.chown(tmp, munge.pw_uid, munge.pw_gid)
    os.replace(tmp, path)
    return True

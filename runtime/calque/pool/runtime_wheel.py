"""The calque runtime an instance installs: a wheel of the running calque, staged in the pool's bucket.

calque is not on any package index, so an instance cannot ``pip install calque==<version>``. The
controller instead stages the wheel of the calque it runs (``stage_runtime``) under
``<prefix>/runtime/calque-<version>-py3-none-any.whl`` with its sha256 in the object's metadata, and
hands the instance a presigned GET URL valid for the instance's TTL (at most 7 days, S3's limit). The
user-data downloads the URL, checks the sha256 and pip installs the file (its dependencies from the
instance's configured index).

The wheel is built from the source tree the running package came from, byte for byte the same for
the same files (fixed timestamps, sorted entries), so staging an unchanged runtime uploads nothing.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from botocore.config import Config
from botocore.exceptions import ClientError

import calque
from calque import __version__
from calque.aws.clients import client
from calque.aws.errors import aws_errors, is_not_found
from calque.errors import UsageError

MAX_URL_TTL_S = 7 * 24 * 3600  # SigV4 presigned URLs live at most 7 days
SHA_METADATA = "calque-sha256"
_SIGV4 = Config(signature_version="s3v4")
_EPOCH = (1980, 1, 1, 0, 0, 0)  # zip's earliest date: the same bytes for the same files


@dataclass(frozen=True)
class StagedRuntime:
    bucket: str
    key: str
    sha256: str
    url: str
    uploaded: bool  # False when the same bytes were already there


def wheel_name(version: str = __version__) -> str:
    return f"calque-{version}-py3-none-any.whl"


def runtime_key(prefix: str, version: str = __version__) -> str:
    """``<prefix>/runtime/calque-<version>-py3-none-any.whl``."""
    return "/".join(p for p in (prefix.strip("/"), "runtime", wheel_name(version)) if p)


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _metadata() -> tuple[str, str]:
    """METADATA and entry_points.txt of the installed calque distribution."""
    try:
        dist = importlib.metadata.distribution("calque")
    except importlib.metadata.PackageNotFoundError:
        raise UsageError("calque is not installed as a distribution: pass the wheel's path instead") from None
    meta = dist.read_text("METADATA") or dist.read_text("PKG-INFO")
    if not meta:
        raise UsageError("the installed calque has no METADATA: pass the wheel's path instead")
    if dist.version != __version__:
        raise UsageError(f"installed calque metadata is {dist.version}, the running code {__version__}: reinstall it")
    return meta, dist.read_text("entry_points.txt") or ""


def build_wheel(dest_dir: str | Path) -> Path:
    """Build the wheel of the running calque (its package files, the installed metadata) in ``dest_dir``.

    Deterministic: the same files give the same bytes, hence the same sha256.
    """
    pkg = Path(calque.__file__).resolve().parent
    meta, entry_points = _metadata()
    files: list[tuple[str, bytes]] = []
    for path in sorted(pkg.rglob("*")):
        rel = path.relative_to(pkg.parent)
        if not path.is_file() or "__pycache__" in rel.parts or path.suffix in (".pyc", ".pyo"):
            continue
        files.append((rel.as_posix(), path.read_bytes()))
    info = f"calque-{__version__}.dist-info"
    files.append((f"{info}/METADATA", meta.encode()))
    files.append(
        (f"{info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: calque\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    )
    if entry_points:
        files.append((f"{info}/entry_points.txt", entry_points.encode()))
    files.append((f"{info}/top_level.txt", b"calque\n"))
    record = "".join(f"{name},{_record_hash(data)},{len(data)}\n" for name, data in files)
    files.append((f"{info}/RECORD", (record + f"{info}/RECORD,,\n").encode()))
    out = Path(dest_dir) / wheel_name()
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in files:
            zi = zipfile.ZipInfo(name, date_time=_EPOCH)
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(zi, data)
    return out


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def stage_runtime(
    bucket: str,
    prefix: str,
    *,
    ttl_s: int,
    wheel: str | Path | None = None,
    region: str | None = None,
    endpoint_url: str | None = None,
    profile: str | None = None,
) -> StagedRuntime:
    """Stage the runtime wheel in ``s3://bucket/<prefix>/runtime/`` and presign it for ``ttl_s`` seconds.

    ``wheel`` reuses a built wheel (its file name must be calque's for this version); otherwise the
    running calque is built. Uploads only when the object's stored sha256 differs. The URL carries
    the signing credentials: temporary ones (SSO, an assumed role) end it when they expire.
    """
    if ttl_s <= 0:
        raise UsageError(f"runtime URL lifetime must be positive, got {ttl_s} s")
    if ttl_s > MAX_URL_TTL_S:
        raise UsageError(
            f"runtime URL lifetime {ttl_s} s exceeds S3's presigned-URL limit of 7 days ({MAX_URL_TTL_S} s):"
            " shorten the instance TTL or pass an explicit runtime pip requirement"
        )
    # SigV4 (the default SigV2 query auth is refused by newer regions); the URL is valid in ``region``
    s3 = client("s3", region=region, endpoint_url=endpoint_url, profile=profile, config=_SIGV4)
    with tempfile.TemporaryDirectory(prefix="calque-wheel-") as tmp:
        if wheel is None:
            path = build_wheel(tmp)
        else:
            path = Path(wheel).expanduser()
            if not path.is_file():
                raise UsageError(f"runtime wheel {path} does not exist")
            if path.name != wheel_name():
                raise UsageError(f"runtime wheel {path.name} is not {wheel_name()} (this calque's version)")
        digest = sha256_file(path)
        key = runtime_key(prefix)
        uploaded = False
        with aws_errors(f"stage the calque runtime at s3://{bucket}/{key}"):
            try:
                head = s3.head_object(Bucket=bucket, Key=key)
                present = head.get("Metadata", {}).get(SHA_METADATA)
            except ClientError as exc:
                if not is_not_found(exc):
                    raise
                present = None
            if present != digest:
                s3.put_object(
                    Bucket=bucket,
                    Key=key,
                    Body=path.read_bytes(),
                    ServerSideEncryption="AES256",
                    ContentType="application/zip",
                    Metadata={SHA_METADATA: digest},
                )
                uploaded = True
            url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=int(ttl_s))
    return StagedRuntime(bucket=bucket, key=key, sha256=digest, url=url, uploaded=uploaded)

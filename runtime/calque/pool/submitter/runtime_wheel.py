"""The calque runtime an instance installs, staged in the pool's bucket: the wheel and a pinned wheelhouse.

calque is not on any package index, so an instance cannot ``pip install calque==<version>``. The
controller instead stages (``stage_runtime``) under ``<prefix>/runtime/``:

- ``calque-<version>-py3-none-any.whl``, the wheel of the calque it runs (``calque.packaging``:
  setuptools, reproducible), and
- ``calque-<version>-wheelhouse-<python>-<platform>.tar``: that wheel plus every runtime dependency at
  the version in ``constraints.txt`` (``calque.packaging.build_wheelhouse``), so instances install
  exactly what CI tested, from no index.

Each object carries its sha256 in its metadata and is uploaded only when that differs; the instance
gets presigned GET URLs valid for its TTL (at most 7 days, S3's limit) and checks the sha256.
A wheelhouse also carries the sha256 of the wheel it was built around: its tar is a function of that
wheel (the pins travel inside it), the Python version and the platform (both in its key), so while
the wheel is the same the staged wheelhouse stands and is not downloaded and packed again (six
seconds of ``pip download`` on every ``pool.yml`` run otherwise).
``predict_runtime`` is check mode's twin: the same sha256s from the same content, nothing uploaded.
"""

from __future__ import annotations

import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calque import __version__
from calque.aws.aws_errors import ClientError, aws_errors, is_not_found
from calque.aws.clients import client
from calque.errors import UsageError
from calque.packaging import build_wheel, build_wheelhouse, sha256_file, wheel_name
from calque.packaging.wheelhouse import REQUIREMENTS, default_platform, default_python_version

__all__ = [
    "MAX_URL_TTL_S",
    "SHA_METADATA",
    "WHEEL_SHA_METADATA",
    "PredictedRuntime",
    "StagedRuntime",
    "build_wheel",
    "predict_runtime",
    "runtime_key",
    "sha256_file",
    "stage_runtime",
    "standing_wheelhouse",
    "stored_metadata",
    "stored_sha",
    "wheel_name",
    "wheelhouse_key",
]

MAX_URL_TTL_S = 7 * 24 * 3600  # SigV4 presigned URLs live at most 7 days
SHA_METADATA = "calque-sha256"
WHEEL_SHA_METADATA = "calque-wheel-sha256"  # on a wheelhouse: the sha256 of the calque wheel inside it


@dataclass(frozen=True)
class StagedRuntime:
    bucket: str
    key: str
    sha256: str
    url: str
    uploaded: bool  # False when the same bytes were already there (the wheel and the wheelhouse)
    wheelhouse_key: str | None = None
    wheelhouse_sha256: str | None = None
    wheelhouse_url: str | None = None


def runtime_key(prefix: str, version: str = __version__) -> str:
    """``<prefix>/runtime/calque-<version>-py3-none-any.whl``."""
    return "/".join(p for p in (prefix.strip("/"), "runtime", wheel_name(version)) if p)


def wheelhouse_key(prefix: str, python_version: str, platform: str, version: str = __version__) -> str:
    """``<prefix>/runtime/calque-<version>-wheelhouse-<python>-<platform>.tar``."""
    name = f"calque-{version}-wheelhouse-{python_version}-{platform}.tar"
    return "/".join(p for p in (prefix.strip("/"), "runtime", name) if p)


def pack_wheelhouse(directory: Path, dest: Path) -> Path:
    """A tar of the wheelhouse, byte for byte the same for the same files (sorted, no times, no owners)."""
    names = sorted(p.name for p in directory.iterdir() if p.is_file())
    if REQUIREMENTS not in names or not any(n.endswith(".whl") for n in names):
        raise UsageError(f"{directory} is not a wheelhouse (`calque runtime wheelhouse` writes one)")
    with tarfile.open(dest, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name in names:
            info = tar.gettarinfo(str(directory / name), arcname=name)
            info.mtime, info.uid, info.gid, info.uname, info.gname, info.mode = 0, 0, 0, "", "", 0o644
            with open(directory / name, "rb") as fh:
                tar.addfile(info, fh)
    return dest


def stored_metadata(s3: Any, bucket: str, key: str) -> dict[str, str]:
    """The metadata the object at ``key`` was staged with (empty when nothing is staged there)."""
    with aws_errors(f"read s3://{bucket}/{key}"):
        try:
            head = s3.head_object(Bucket=bucket, Key=key)
        except ClientError as exc:
            if is_not_found(exc):
                return {}
            raise
    return dict(head.get("Metadata", {}))


def stored_sha(s3: Any, bucket: str, key: str) -> str | None:
    """The sha256 the object at ``key`` was staged with (None when nothing is staged there)."""
    return stored_metadata(s3, bucket, key).get(SHA_METADATA)


def standing_wheelhouse(stored: dict[str, str], wheel_digest: str) -> str | None:
    """The staged wheelhouse's sha256 when it was built around the wheel ``wheel_digest`` (so that
    building one again would make the same tar); None when it must be built (none staged, another
    wheel's, or staged by a calque that did not record its wheel)."""
    if stored.get(WHEEL_SHA_METADATA) != wheel_digest:
        return None
    return stored.get(SHA_METADATA)


def _put_if_changed(
    s3: Any, bucket: str, key: str, path: Path, content_type: str, extra: dict[str, str] | None = None
) -> tuple[str, bool]:
    """Upload ``path`` unless ``key`` holds it already with the same metadata (its sha256 and ``extra``)."""
    digest = sha256_file(path)
    metadata = {SHA_METADATA: digest, **(extra or {})}
    stored = stored_metadata(s3, bucket, key)
    if all(stored.get(k) == v for k, v in metadata.items()):
        return digest, False
    with aws_errors(f"stage the calque runtime at s3://{bucket}/{key}"):
        s3.put_object(
            Bucket=bucket,
            Key=key,
            Body=path.read_bytes(),
            ServerSideEncryption="AES256",
            ContentType=content_type,
            Metadata=metadata,
        )
    return digest, True


def _presign(s3: Any, bucket: str, key: str, ttl_s: int) -> str:
    with aws_errors(f"presign s3://{bucket}/{key}"):
        return str(s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=ttl_s))


def _staging_client(ttl_s: int, region: str | None, endpoint_url: str | None, profile: str | None) -> Any:
    if ttl_s <= 0:
        raise UsageError(f"runtime URL lifetime must be positive, got {ttl_s} s")
    if ttl_s > MAX_URL_TTL_S:
        raise UsageError(
            f"runtime URL lifetime {ttl_s} s exceeds S3's presigned-URL limit of 7 days ({MAX_URL_TTL_S} s):"
            " shorten the instance TTL or pass an explicit runtime pip requirement"
        )
    # SigV4 (the default SigV2 query auth is refused by newer regions); the URL is valid in ``region``
    return client("s3", region=region, endpoint_url=endpoint_url, profile=profile, signature_version="s3v4")


def _wheel(tmp: str, wheel: str | Path | None, progress: Callable[[str], None]) -> Path:
    """The wheel to stage: ``wheel`` checked, or this calque built into ``tmp``."""
    if wheel is None:
        progress(f"building {wheel_name()}")
        return build_wheel(tmp)
    path = Path(wheel).expanduser()
    if not path.is_file():
        raise UsageError(f"runtime wheel {path} does not exist")
    if path.name != wheel_name():
        raise UsageError(f"runtime wheel {path.name} is not {wheel_name()} (this calque's version)")
    return path


def _reused_house(wheelhouse: str | Path, digest: str) -> Path:
    house = Path(wheelhouse).expanduser()
    if (house / wheel_name()).is_file() and sha256_file(house / wheel_name()) != digest:
        raise UsageError(f"wheelhouse {house} holds a different {wheel_name()} than the staged wheel")
    return house


def stage_runtime(
    bucket: str,
    prefix: str,
    *,
    ttl_s: int,
    wheel: str | Path | None = None,
    wheelhouse: str | Path | bool = False,
    python_version: str | None = None,
    platform: str | None = None,
    region: str | None = None,
    endpoint_url: str | None = None,
    profile: str | None = None,
    progress: Callable[[str], None] = lambda _msg: None,
) -> StagedRuntime:
    """Stage the runtime wheel (and the wheelhouse) in ``s3://bucket/<prefix>/runtime/``, presigned for ``ttl_s``.

    ``wheel`` reuses a built wheel (its file name must be calque's for this version); otherwise the
    running calque's sources are built. ``wheelhouse``: True builds one (``python_version``/``platform``,
    default this controller's), a path reuses a built one, False stages the wheel alone (its
    dependencies then come from the instance's index). Uploads only what changed. The URLs carry the
    signing credentials: temporary ones (SSO, an assumed role) end them when they expire.
    """
    s3 = _staging_client(ttl_s, region, endpoint_url, profile)
    with tempfile.TemporaryDirectory(prefix="calque-runtime-") as tmp:
        path = _wheel(tmp, wheel, progress)
        key = runtime_key(prefix)
        digest, uploaded = _put_if_changed(s3, bucket, key, path, "application/zip")
        staged = StagedRuntime(bucket, key, digest, _presign(s3, bucket, key, int(ttl_s)), uploaded)
        if wheelhouse is False:
            return staged
        pyver, plat = python_version or default_python_version(), platform or default_platform()
        wh_key = wheelhouse_key(prefix, pyver, plat)
        standing = standing_wheelhouse(stored_metadata(s3, bucket, wh_key), digest) if wheelhouse is True else None
        if standing is not None:
            progress(f"the wheelhouse at s3://{bucket}/{wh_key} was built around this wheel: it stands")
            wh_digest, wh_uploaded = standing, False
        else:
            if wheelhouse is True:
                house = build_wheelhouse(
                    Path(tmp) / "wheelhouse", python_version=pyver, platform=plat, wheel=path, progress=progress
                ).path
            else:
                house = _reused_house(wheelhouse, digest)
            tar = pack_wheelhouse(house, Path(tmp) / "wheelhouse.tar")
            progress(f"staging the wheelhouse at s3://{bucket}/{wh_key}")
            # only a wheelhouse calque built says which wheel it was built around: a reused one may hold
            # other files (hashes in its requirements, say) than a build around this wheel would
            built_around = {WHEEL_SHA_METADATA: digest} if wheelhouse is True else None
            wh_digest, wh_uploaded = _put_if_changed(s3, bucket, wh_key, tar, "application/x-tar", built_around)
    return StagedRuntime(
        bucket,
        key,
        digest,
        staged.url,
        uploaded or wh_uploaded,
        wh_key,
        wh_digest,
        _presign(s3, bucket, wh_key, int(ttl_s)),
    )


@dataclass(frozen=True)
class PredictedRuntime:
    """What ``stage_runtime`` would stage, read and built locally with nothing uploaded (check mode)."""

    staged: StagedRuntime  # its URLs signed now (presigning is local); only their signatures differ later
    stored_sha256: str | None  # what the wheel's key holds now
    stored_wheelhouse_sha256: str | None
    # False when the wheelhouse would be rebuilt around a new wheel: its sha256 is known only then
    wheelhouse_known: bool = True


def predict_runtime(
    bucket: str,
    prefix: str,
    *,
    ttl_s: int,
    wheel: str | Path | None = None,
    wheelhouse: str | Path | bool = False,
    python_version: str | None = None,
    platform: str | None = None,
    region: str | None = None,
    endpoint_url: str | None = None,
    profile: str | None = None,
    progress: Callable[[str], None] = lambda _msg: None,
) -> PredictedRuntime:
    """``stage_runtime``'s result without uploading: the digests from content, the URLs signed locally.

    The wheel is built (or ``wheel`` read) into a temporary directory and hashed; a reused wheelhouse
    is packed and hashed. A wheelhouse to build is not downloaded: the staged one stands when it was
    built around this wheel (``standing_wheelhouse``), as in the real run. Otherwise the real run builds
    one whose sha256 only it learns (``wheelhouse_known`` False).
    """
    s3 = _staging_client(ttl_s, region, endpoint_url, profile)
    key = runtime_key(prefix)
    stored = stored_sha(s3, bucket, key)
    with tempfile.TemporaryDirectory(prefix="calque-runtime-") as tmp:
        path = _wheel(tmp, wheel, progress)
        digest = sha256_file(path)
        url = _presign(s3, bucket, key, int(ttl_s))
        if wheelhouse is False:
            return PredictedRuntime(StagedRuntime(bucket, key, digest, url, stored != digest), stored, None)
        pyver, plat = python_version or default_python_version(), platform or default_platform()
        wh_key = wheelhouse_key(prefix, pyver, plat)
        wh_metadata = stored_metadata(s3, bucket, wh_key)
        wh_stored = wh_metadata.get(SHA_METADATA)
        known = True
        if wheelhouse is True:
            wh_digest = standing_wheelhouse(wh_metadata, digest)
            known = wh_digest is not None
        else:
            wh_digest = sha256_file(pack_wheelhouse(_reused_house(wheelhouse, digest), Path(tmp) / "wheelhouse.tar"))
    uploaded = stored != digest or not known or wh_stored != wh_digest
    staged = StagedRuntime(
        bucket, key, digest, url, uploaded, wh_key, wh_digest, _presign(s3, bucket, wh_key, int(ttl_s))
    )
    return PredictedRuntime(staged, stored, wh_stored, known)

"""Complete a lifecycle action with nothing but the standard library (private to the user-data).

The bootstrap's ABANDON when a step before the runtime exists fails (the driver check, the
runtime's install): no boto3 is there yet, so this file is written out by the user-data and run by
the system's python3. It reads the instance's id and role credentials from IMDSv2, signs one
``CompleteLifecycleAction`` with SigV4 and posts it. Everything after the install uses boto3
through ``calque.aws.clients`` (``calque.pool.worker.instance_ready``). Keep this file stdlib-only and short: it
travels inside the user-data, which AWS caps at 16 KB.

Usage: python3 lifecycle_signal.py IMDS REGION ENDPOINT GROUP HOOK RESULT
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request


def _imds(base: str, path: str, token: str) -> str:
    req = urllib.request.Request(base + "/latest/meta-data/" + path, headers={"X-aws-ec2-metadata-token": token})
    with urllib.request.urlopen(req, timeout=5) as r:
        return str(r.read().decode())


def _sign(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def complete(imds: str, region: str, endpoint: str, group: str, hook: str, result: str) -> str:
    put = urllib.request.Request(
        imds + "/latest/api/token", method="PUT", headers={"X-aws-ec2-metadata-token-ttl-seconds": "300"}
    )
    with urllib.request.urlopen(put, timeout=5) as r:
        token = r.read().decode()
    instance = _imds(imds, "instance-id", token)
    role = _imds(imds, "iam/security-credentials/", token).split()[0]
    creds = json.loads(_imds(imds, "iam/security-credentials/" + role, token))
    url = endpoint or "https://autoscaling." + region + ".amazonaws.com"
    host = urllib.parse.urlsplit(url).netloc
    if os.environ.get("CALQUE_OFFLINE") == "1" and host.split(":")[0] not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit("CALQUE_OFFLINE=1: refusing the non-loopback endpoint " + url)
    body = urllib.parse.urlencode(
        {
            "Action": "CompleteLifecycleAction",
            "Version": "2011-01-01",
            "AutoScalingGroupName": group,
            "LifecycleHookName": hook,
            "InstanceId": instance,
            "LifecycleActionResult": result,
        }
    )
    now = datetime.datetime.now(datetime.timezone.utc)
    stamp, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    headers = {
        "content-type": "application/x-www-form-urlencoded; charset=utf-8",
        "host": host,
        "x-amz-date": stamp,
        "x-amz-security-token": creds["Token"],
    }
    signed = ";".join(sorted(headers))
    lines = [k + ":" + headers[k] for k in sorted(headers)]
    canonical = "\n".join(["POST", "/", "", *lines, "", signed, hashlib.sha256(body.encode()).hexdigest()])
    scope = day + "/" + region + "/autoscaling/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = ("AWS4" + creds["SecretAccessKey"]).encode()
    for part in (day, region, "autoscaling", "aws4_request"):
        key = _sign(key, part)
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = (
        "AWS4-HMAC-SHA256 Credential=" + creds["AccessKeyId"] + "/" + scope
        + ", SignedHeaders=" + signed + ", Signature=" + signature
    )  # fmt: skip
    req = urllib.request.Request(url.rstrip("/") + "/", data=body.encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            r.read()
    except urllib.error.HTTPError as exc:  # say what AWS said, then fail
        raise SystemExit("CompleteLifecycleAction " + result + " refused: " + exc.read().decode()[:300]) from None
    return instance


if __name__ == "__main__":
    done = complete(*sys.argv[1:7])
    print("calque bootstrap: lifecycle action " + sys.argv[6] + " completed for " + done)

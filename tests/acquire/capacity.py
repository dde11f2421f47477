"""Inject EC2 errors moto never raises, at the botocore layer of one client.

``CapacityFaults(ec2).out_of_capacity("g6.xlarge", "us-east-1a")`` makes every RunInstances call on
that client for that type in that AZ answer ``InsufficientInstanceCapacity`` (or any code given),
before the request leaves the client: a real botocore error response, parsed and raised the way
botocore raises one from AWS. ``.limit("g6.xlarge", "us-east-1b", 1)`` gives that pool finite
capacity: a MinCount=1 call is filled up to what is left (as EC2 does), then the pool is out.

EC2 launches as many as it can up to MaxCount (at least MinCount); moto launches exactly MinCount.
Every RunInstances call that passes through here is rewritten to MinCount=MaxCount=<what EC2
would launch>, so moto answers the way EC2 would. ``ServiceQuotaValues`` answers GetServiceQuota with chosen values.
``CallCounter`` counts API calls and can add latency per call (for benchmarks).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

from botocore.awsrequest import AWSResponse


def _error(code: str, message: str, status: int = 400) -> tuple[AWSResponse, dict[str, Any]]:
    http = AWSResponse("https://ec2.invalid/", status, {}, None)
    return http, {"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": status}}


class CapacityFaults:
    """Per (instance type, AZ, market) RunInstances failures on one EC2 client."""

    def __init__(self, ec2: Any) -> None:
        self.ec2 = ec2
        self.faults: dict[tuple[str, str, str], str] = {}
        self.left: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()
        self.refused: list[tuple[str, str, str]] = []
        self._az_of: dict[str, str] = {s["SubnetId"]: s["AvailabilityZone"] for s in ec2.describe_subnets()["Subnets"]}
        ec2.meta.events.register("before-call.ec2.RunInstances", self._hook)

    def out_of_capacity(
        self, instance_type: str, az: str, code: str = "InsufficientInstanceCapacity", market: str = "*"
    ) -> CapacityFaults:
        self.faults[(instance_type, az, market)] = code
        return self

    def limit(self, instance_type: str, az: str, capacity: int) -> CapacityFaults:
        self.left[(instance_type, az)] = capacity
        return self

    def _hook(self, params: dict[str, Any], **_: Any) -> tuple[AWSResponse, dict[str, Any]] | None:
        body = params.get("body") or {}
        itype = body.get("InstanceType", "")
        az = self._az_of.get(body.get("SubnetId", ""), body.get("Placement.AvailabilityZone", "*"))
        market = "spot" if body.get("InstanceMarketOptions.MarketType") == "spot" else "on-demand"
        with self._lock:
            if (itype, az) in self.left:
                left = self.left[(itype, az)]
                want, least = int(body.get("MaxCount", 1)), int(body.get("MinCount", 1))
                if left < least:
                    self.refused.append((itype, az, market))
                    return _error("InsufficientInstanceCapacity", f"No {itype} capacity left in {az}.")
                body["MinCount"] = body["MaxCount"] = str(min(want, left))
                self.left[(itype, az)] = left - min(want, left)
                return None
        for key in ((itype, az, market), (itype, az, "*"), (itype, "*", market), (itype, "*", "*")):
            code = self.faults.get(key)
            if code:
                self.refused.append((itype, az, market))
                return _error(code, f"We currently do not have sufficient {itype} capacity in {az} ({market}).")
        body["MinCount"] = body.get("MaxCount", body.get("MinCount", "1"))
        return None


class ServiceQuotaValues:
    """GetServiceQuota answers for chosen EC2 quota codes (moto has none for EC2)."""

    def __init__(self, quotas: Any, values: dict[str, float]) -> None:
        self.values = values
        quotas.meta.events.register("before-call.service-quotas.GetServiceQuota", self._hook)

    def _hook(self, params: dict[str, Any], **_: Any) -> tuple[AWSResponse, dict[str, Any]] | None:
        body = params.get("body") or {}
        code = body.get("QuotaCode") if isinstance(body, dict) else None
        if code is None and isinstance(body, (bytes, str)):
            import json

            code = json.loads(body or "{}").get("QuotaCode")
        if code not in self.values:
            return None
        http = AWSResponse("https://servicequotas.invalid/", 200, {}, None)
        quota = {"ServiceCode": "ec2", "QuotaCode": code, "QuotaName": code, "Value": self.values[code]}
        return http, {"Quota": quota, "ResponseMetadata": {"HTTPStatusCode": 200}}


class CallCounter:
    """Counts API calls per operation on a client and optionally adds ``latency_s`` to each."""

    def __init__(self, client: Any, latency_s: float = 0.0) -> None:
        self.calls: Counter[str] = Counter()
        self.latency_s = latency_s
        self._lock = threading.Lock()
        # before-parameter-build fires once per API call, before any before-call hook can answer it
        # (a CapacityFaults error still costs the caller a round trip, so it gets the latency too)
        service = client.meta.service_model.service_id.hyphenize()
        client.meta.events.register(f"before-parameter-build.{service}", self._count)

    def _count(self, model: Any, **_: Any) -> None:
        with self._lock:
            self.calls[model.name] += 1
        if self.latency_s:
            time.sleep(self.latency_s)

    @property
    def total(self) -> int:
        return sum(self.calls.values())

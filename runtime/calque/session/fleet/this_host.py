"""This instance as an elastic session host's own steps see it (``calque session fleet ...``): its
metadata from IMDSv2 and its AWS clients, made here from the endpoint, region and profile the command
was given, so the CLI only reads options and prints."""

from __future__ import annotations

from functools import cached_property
from typing import Any

from calque.errors import InfrastructureError, UsageError
from calque.models.fleet import HostRegistration, MungeKeySource
from calque.session.fleet.mungekey import fetch_key
from calque.session.fleet.register import deregister, register


class ThisHost:
    """This instance: IMDS read on first use (``munge-key`` never needs it), one client per call."""

    def __init__(
        self,
        imds: str | None = None,
        *,
        region: str | None = None,
        endpoint_url: str | None = None,
        profile: str | None = None,
    ) -> None:
        self.imds_endpoint = imds
        self.region, self.endpoint_url, self.profile = region, endpoint_url, profile

    @cached_property
    def metadata(self) -> Any:
        """The IMDSv2 client (``aws/imds.py``'s one builder); offline, only a loopback endpoint."""
        from calque.aws.imds import metadata_client

        if self.imds_endpoint is None:
            raise UsageError("no IMDS endpoint given (--imds)")
        imds = metadata_client(self.imds_endpoint)
        if imds is None:
            raise UsageError(f"offline: IMDS {self.imds_endpoint} is not a loopback address")
        return imds

    def meta(self, path: str) -> str:
        value = self.metadata.get(path)
        if not value:
            raise InfrastructureError(f"IMDS has no {path}: is this an EC2 instance?")
        return str(value).strip()

    @cached_property
    def instance_id(self) -> str:
        return self.meta("instance-id")

    def client(self, service: str) -> Any:
        from calque.aws.clients import client

        return client(service, region=self.region, endpoint_url=self.endpoint_url, profile=self.profile)

    def munge_key(self, source: MungeKeySource) -> bytes:
        """The institution's key, through the one client its source needs."""
        if source.ssm_parameter is not None:
            return fetch_key(source, ssm=self.client("ssm"))
        return fetch_key(source, s3=self.client("s3"))

    def register(self, reg: HostRegistration) -> str:
        """This host's registration written where the broker reads its class; the parameter's name."""
        return register(self.client("ssm"), reg)

    def deregister(self, fleet_class: str) -> bool:
        """This host's registration removed; False when there was none."""
        iid = self.instance_id  # IMDS before AWS, as every step here asks them
        return deregister(self.client("ssm"), fleet_class, iid)

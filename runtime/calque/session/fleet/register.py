"""A session host of an elastic class registering with the broker: one SSM parameter per instance.

``/calque/session-fleet/<class>/hosts/<instance-id>`` holds its ``HostRegistration`` (name, address,
port, offers): the broker's fleet thread reads the class's path and reaches the host over TCP with
munge like any host of ``institution.yaml``. The instance profile may write only under its class's
path (``calque.aws.fleet_iam``); the host deletes its own parameter when it leaves the group.
"""

from __future__ import annotations

from typing import Any

from calque.aws.aws_errors import ClientError, aws_errors, is_not_found
from calque.models.fleet import HostRegistration, registration_path


def parameter_name(reg: HostRegistration) -> str:
    return f"{registration_path(reg.fleet_class)}/{reg.instance_id}"


def register(ssm: Any, reg: HostRegistration) -> str:
    """Write (or overwrite) the host's registration; returns the parameter's name."""
    name = parameter_name(reg)
    with aws_errors(f"register host {reg.name} of class {reg.fleet_class} at {name}"):
        ssm.put_parameter(Name=name, Value=reg.model_dump_json(), Type="String", Overwrite=True, Tier="Standard")
    return name


def deregister(ssm: Any, fleet_class: str, instance_id: str) -> bool:
    """Delete the host's registration; False when there was none."""
    name = f"{registration_path(fleet_class)}/{instance_id}"
    try:
        ssm.delete_parameter(Name=name)
    except ClientError as exc:
        if is_not_found(exc) or "ParameterNotFound" in str(exc):
            return False
        with aws_errors(f"deregister {name}"):
            raise
    return True

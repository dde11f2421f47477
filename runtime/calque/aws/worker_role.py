"""``WorkerRole``: one IAM role, its one inline policy and its instance profile, made or removed together.

A pool's workers (and a session-host class's hosts) run under a role that calque renders from the
pool's name (``calque.aws.iam_policy``): this is the one place that role is made to match its
documents. What is ensured is exactly what the documents say: the trust policy, the one inline
policy, no managed policy and no other inline policy (either would widen the role beyond its pool),
the ``calque:pool`` tag, and an instance profile holding that role alone. ``ensure``/``remove`` plan
first and take ``check_mode``, so a module's check mode and diff are the real run's path. A role
tagged for another pool is refused (``ForeignPoolError``), never adopted or deleted.
"""

from __future__ import annotations

import json
from typing import Any, Protocol
from urllib.parse import unquote

from botocore.exceptions import ClientError
from pydantic import Field

from calque.aws.aws_errors import aws_errors, error_code
from calque.models.base import CalqueModel
from calque.models.pool_names import refuse_foreign


class RoleState(CalqueModel):
    """What the role and its instance profile are (or would be, in check mode); ``exists`` is the role's."""

    role_name: str
    exists: bool = False
    role_arn: str | None = None
    trust_policy: dict[str, Any] | None = None
    description: str | None = None
    tags: dict[str, str] = Field(default_factory=dict)
    managed_policies: list[str] = Field(default_factory=list)
    inline_policies: dict[str, dict[str, Any]] = Field(default_factory=dict)
    instance_profile_name: str
    instance_profile_arn: str | None = None
    instance_profile_roles: list[str] = Field(default_factory=list)


class RoleChange(CalqueModel):
    changed: bool
    actions: list[str]
    before: RoleState
    after: RoleState


def _document(doc: Any) -> dict[str, Any]:
    """A policy document as IAM returns it (a dict from boto3, or URL-encoded JSON text) as a dict."""
    if isinstance(doc, dict):
        return doc
    loaded: dict[str, Any] = json.loads(unquote(str(doc)))
    return loaded


class RoleDocuments(Protocol):
    """What a pool's (``iam_policy.PoolIamDocuments``) and a class's (``fleet_iam.FleetIamDocuments``)
    documents both name: the role, its profile, its one inline policy's name, its trust and tags."""

    role_name: str
    instance_profile_name: str
    policy_name: str
    trust_policy: dict[str, Any]
    tags: dict[str, str]


class WorkerRole:
    """Role ``role_name`` trusting ``trust``, with inline ``policy_name`` = ``policy``, in profile ``profile_name``."""

    def __init__(
        self, iam: Any, documents: RoleDocuments, *, pool: str, policy: dict[str, Any], description: str
    ) -> None:
        """The role ``documents`` describe, with ``policy`` (the workers' or the hosts') its one inline policy."""
        self.iam = iam
        self.pool = pool
        self.role_name = documents.role_name
        self.profile_name = documents.instance_profile_name
        self.policy_name = documents.policy_name
        self.trust = documents.trust_policy
        self.policy = policy
        self.tags = documents.tags
        self.description = description

    # -- reading -------------------------------------------------------------------------------

    def state(self) -> RoleState:
        """The role, its policies and its instance profile as they are now."""
        state = RoleState(role_name=self.role_name, instance_profile_name=self.profile_name)
        profile = self._get(
            "instance profile", lambda: self.iam.get_instance_profile(InstanceProfileName=self.profile_name)
        )
        if profile is not None:
            state.instance_profile_arn = profile["InstanceProfile"]["Arn"]
            state.instance_profile_roles = sorted(r["RoleName"] for r in profile["InstanceProfile"].get("Roles", []))
        role = self._get("role", lambda: self.iam.get_role(RoleName=self.role_name))
        if role is None:
            return state
        got = role["Role"]
        state.exists, state.role_arn = True, got["Arn"]
        state.trust_policy = _document(got.get("AssumeRolePolicyDocument", {}))
        state.description = got.get("Description")
        with aws_errors(f"read the tags of IAM role {self.role_name}"):
            state.tags = {t["Key"]: t["Value"] for t in self.iam.list_role_tags(RoleName=self.role_name)["Tags"]}
        refuse_foreign("IAM role", self.role_name, state.tags, self.pool)
        with aws_errors(f"read the policies of IAM role {self.role_name}"):
            attached = self.iam.list_attached_role_policies(RoleName=self.role_name)["AttachedPolicies"]
            state.managed_policies = sorted(p["PolicyArn"] for p in attached)
            for name in self.iam.list_role_policies(RoleName=self.role_name)["PolicyNames"]:
                doc = self.iam.get_role_policy(RoleName=self.role_name, PolicyName=name)["PolicyDocument"]
                state.inline_policies[name] = _document(doc)
        return state

    def _get(self, what: str, call: Any) -> dict[str, Any] | None:
        """``call()``'s answer, or None when IAM says there is no such entity."""
        with aws_errors(f"read IAM {what} of pool {self.pool}"):
            try:
                got: dict[str, Any] = call()
            except ClientError as exc:
                if error_code(exc) == "NoSuchEntity":
                    return None
                raise
            return got

    def desired(self, before: RoleState) -> RoleState:
        return RoleState(
            role_name=self.role_name,
            exists=True,
            role_arn=before.role_arn,
            trust_policy=self.trust,
            description=self.description,
            tags={**before.tags, **self.tags},  # tags of its own are kept (purge_tags: false)
            inline_policies={self.policy_name: self.policy},
            instance_profile_name=self.profile_name,
            instance_profile_arn=before.instance_profile_arn,
            instance_profile_roles=[self.role_name],
        )

    # -- changing ------------------------------------------------------------------------------

    def ensure(self, *, check_mode: bool = False) -> RoleChange:
        """Make the role, its one inline policy and its profile match the documents; each step only when needed."""
        before = self.state()
        after = self.desired(before)
        steps = self._ensure_steps(before)
        if not check_mode:
            for _, step in steps:
                step()
            after = self.state()
        return RoleChange(changed=bool(steps), actions=[a for a, _ in steps], before=before, after=after)

    def _ensure_steps(self, before: RoleState) -> list[tuple[str, Any]]:
        iam, role = self.iam, self.role_name
        steps: list[tuple[str, Any]] = []

        def step(action: str, call: Any) -> None:
            def run() -> None:
                with aws_errors(action):
                    call()

            steps.append((action, run))

        trust = json.dumps(self.trust)
        tags = [{"Key": k, "Value": v} for k, v in self.tags.items()]
        if not before.exists:
            step(
                f"create IAM role {role}",
                lambda: iam.create_role(
                    RoleName=role, AssumeRolePolicyDocument=trust, Description=self.description, Tags=tags
                ),
            )
        else:
            if before.trust_policy != self.trust:
                step(
                    f"update the trust policy of IAM role {role}",
                    lambda: iam.update_assume_role_policy(RoleName=role, PolicyDocument=trust),
                )
            if before.description != self.description:
                step(
                    f"update the description of IAM role {role}",
                    lambda: iam.update_role(RoleName=role, Description=self.description),
                )
            if any(before.tags.get(k) != v for k, v in self.tags.items()):
                step(f"tag IAM role {role}", lambda: iam.tag_role(RoleName=role, Tags=tags))
        for arn in before.managed_policies:
            step(
                f"detach managed policy {arn} from IAM role {role}",
                lambda arn=arn: iam.detach_role_policy(RoleName=role, PolicyArn=arn),
            )
        for name in sorted(set(before.inline_policies) - {self.policy_name}):
            step(
                f"delete inline policy {name} of IAM role {role}",
                lambda name=name: iam.delete_role_policy(RoleName=role, PolicyName=name),
            )
        if before.inline_policies.get(self.policy_name) != self.policy:
            step(
                f"put inline policy {self.policy_name} on IAM role {role}",
                lambda: iam.put_role_policy(
                    RoleName=role, PolicyName=self.policy_name, PolicyDocument=json.dumps(self.policy)
                ),
            )
        profile = self.profile_name
        if before.instance_profile_arn is None:
            step(
                f"create instance profile {profile}",
                lambda: iam.create_instance_profile(InstanceProfileName=profile, Tags=tags),
            )
        for other in before.instance_profile_roles:
            if other != role:
                step(
                    f"remove IAM role {other} from instance profile {profile}",
                    lambda other=other: iam.remove_role_from_instance_profile(
                        InstanceProfileName=profile, RoleName=other
                    ),
                )
        if role not in before.instance_profile_roles:
            step(
                f"add IAM role {role} to instance profile {profile}",
                lambda: iam.add_role_to_instance_profile(InstanceProfileName=profile, RoleName=role),
            )
        return steps

    def remove(self, *, check_mode: bool = False) -> RoleChange:
        """Remove the instance profile and the role with its policies (a role tagged for another pool is refused)."""
        before = self.state()
        iam, role, profile = self.iam, self.role_name, self.profile_name
        steps: list[tuple[str, Any]] = []
        if before.instance_profile_arn is not None:
            for member in before.instance_profile_roles:
                steps.append(
                    (
                        f"remove IAM role {member} from instance profile {profile}",
                        lambda m=member: iam.remove_role_from_instance_profile(InstanceProfileName=profile, RoleName=m),
                    )
                )
            steps.append(
                (f"delete instance profile {profile}", lambda: iam.delete_instance_profile(InstanceProfileName=profile))
            )
        if before.exists:
            for arn in before.managed_policies:
                steps.append(
                    (
                        f"detach managed policy {arn} from IAM role {role}",
                        lambda a=arn: iam.detach_role_policy(RoleName=role, PolicyArn=a),
                    )
                )
            for name in before.inline_policies:
                steps.append(
                    (
                        f"delete inline policy {name} of IAM role {role}",
                        lambda n=name: iam.delete_role_policy(RoleName=role, PolicyName=n),
                    )
                )
            steps.append((f"delete IAM role {role}", lambda: self._delete_role()))
        if not check_mode:
            for action, call in steps:
                with aws_errors(action):
                    call()
        after = RoleState(role_name=role, instance_profile_name=profile)
        return RoleChange(changed=bool(steps), actions=[a for a, _ in steps], before=before, after=after)

    def _delete_role(self) -> None:
        # A role still in an instance profile of another name (made by hand) cannot be deleted: leave it out first.
        for held in self.iam.list_instance_profiles_for_role(RoleName=self.role_name)["InstanceProfiles"]:
            self.iam.remove_role_from_instance_profile(
                InstanceProfileName=held["InstanceProfileName"], RoleName=self.role_name
            )
        self.iam.delete_role(RoleName=self.role_name)

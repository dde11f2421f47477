#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, calque developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: session_fleet_iam
short_description: A calque session-host class's hosts' IAM role, inline policy and instance profile
version_added: 0.1.0
description:
  - Makes, or removes, the IAM role an elastic session-host class's hosts run under, its one inline
    policy and its instance profile, named from the class (the documents
    M(calque.gpu.session_fleet_iam_policy) renders, for the account of the credentials in use).
  - The role ends up exactly as rendered, by the same rule as M(calque.gpu.pool_iam). It trusts EC2, it has
    the one inline policy (the munge key's one place, the hosts' registration, the class's own group), no
    managed policy or other inline policy, the C(calque:pool) tag, and a profile holding this role alone.
  - A role tagged C(calque:pool) for another pool or class is refused, neither adopted nor deleted.
  - A thin face over the C(calque.ops.session_fleet_iam) operation (C(calque.aws.worker_role)).
author: calque developers (@calque)
options:
  fleet_class:
    description:
      - The session-host class, for example V(teaching-rtx6000).
    type: str
    required: true
  munge_key:
    description:
      - Where the institution's munge key lives, one of C(ssm_parameter) (a SecureString holding base64 of
        C(munge.key)) or C(s3_bucket) and C(s3_key) (an object stored with SSE); C(kms_key_arn) when a KMS key of
        your own encrypts it. Required with O(state=present).
    type: dict
  bucket:
    description:
      - The bucket the class's runtime is staged in.
    type: str
    required: true
  state:
    description:
      - V(present) creates the role, policy and profile or brings them to the documents; V(absent)
        removes the profile, then the role with its policies.
    type: str
    choices: [present, absent]
    default: present
extends_documentation_fragment:
  - calque.gpu.runtime
  - calque.gpu.offline
  - calque.gpu.attributes
  - amazon.aws.common.modules
  - amazon.aws.region.modules
  - amazon.aws.boto3
attributes:
  check_mode:
    support: full
    details: Plans every IAM call the real run would make (listed in the diff's actions) and makes none.
  diff_mode:
    support: full
    details: Shows the role, its policies and its instance profile before and after.
  idempotent:
    support: full
    details: Compares the role's trust policy, description, tags, policies and profile with the documents; a match is not touched.
"""

EXAMPLES = r"""
- name: The hosts' role, inline policy and instance profile of a class
  calque.gpu.session_fleet_iam:
    fleet_class: teaching-rtx6000
    munge_key:
      ssm_parameter: /calque/munge-key
    bucket: calque-runtime
    region: us-east-1
"""

RETURN = r"""
fleet_class:
  description: The class.
  returned: always
  type: str
pool:
  description: The pool name the class's AWS names derive from (C(fleet/<class>)).
  returned: always
  type: str
role_name:
  description: The hosts' IAM role name.
  returned: always
  type: str
instance_profile_name:
  description: The instance profile's name (the role's name).
  returned: always
  type: str
policy_name:
  description: The name of the role's inline policy.
  returned: always
  type: str
trust_policy:
  description: The role's trust policy document.
  returned: always
  type: dict
host_policy:
  description: The role's inline policy document.
  returned: always
  type: dict
broker_policy:
  description: The policy document the broker's credentials need for this class.
  returned: always
  type: dict
profile_exists:
  description: Whether the instance profile exists after the run (false in check mode when the run would make it).
  returned: always
  type: bool
tags:
  description: The tags the class's IAM resources carry (C(calque:pool), C(calque:session-class)).
  returned: always
  type: dict
"""

from ansible_collections.amazon.aws.plugins.module_utils.modules import AnsibleAWSModule
from ansible_collections.calque.gpu.plugins.module_utils._ops import run_op


def main():
    argument_spec = dict(
        fleet_class=dict(type="str", required=True),
        munge_key=dict(type="dict", no_log=False),
        bucket=dict(type="str", required=True),
        state=dict(type="str", choices=["present", "absent"], default="present"),
    )
    run_op(AnsibleAWSModule, "session_fleet_iam", argument_spec)


if __name__ == "__main__":
    main()

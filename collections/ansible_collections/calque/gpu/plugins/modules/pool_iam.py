#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, calque developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: pool_iam
short_description: A calque pool's workers' IAM role, inline policy and instance profile
version_added: 0.1.0
description:
  - Makes, or removes, the IAM role a pool's workers run under, its one inline policy and its instance
    profile, all named from the pool (the documents M(calque.gpu.pool_iam_policy) renders, for the
    account of the credentials in use).
  - The role ends up exactly as rendered, nothing more. It trusts EC2, it has the one inline policy
    (the pool's own queue, its own keys in the bucket, its own Auto Scaling group) and no managed
    policy or other inline policy, since either would let the role reach beyond its pool. It is tagged
    C(calque:pool), and the instance profile holds this role alone. Tags of your own are kept.
  - A role tagged C(calque:pool) for another pool is refused, neither adopted nor deleted.
  - A thin face over the C(calque.ops.pool_iam) operation (C(calque.aws.worker_role)).
author: calque developers (@calque)
options:
  pool:
    description:
      - The pool's name, for example V(lab-a/embedder) (1 to 3 segments of a-z, 0-9 and C(-) joined by C(/)).
    type: str
    required: true
  bucket:
    description:
      - The pool's S3 bucket (the inline policy grants the pool's own keys in it).
    type: str
    required: true
  prefix:
    description:
      - The key prefix of the pool's objects in the bucket (the pool spec's C(prefix)).
    type: str
    default: calque
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
- name: Workers' role, inline policy and instance profile
  calque.gpu.pool_iam:
    pool: lab-a/embedder
    bucket: lab-a-calque-runs
    region: us-east-1
  register: __iam

- name: Remove them (after the pool's instances are gone)
  calque.gpu.pool_iam:
    pool: lab-a/embedder
    bucket: lab-a-calque-runs
    region: us-east-1
    state: absent
"""

RETURN = r"""
role_name:
  description: The workers' IAM role name.
  returned: always
  type: str
  sample: calque-lab-a-embedder-a22b957d-worker
role_arn:
  description: The workers' IAM role ARN.
  returned: always
  type: str
instance_profile_name:
  description: The instance profile's name (the role's name).
  returned: always
  type: str
instance_profile_arn:
  description: The instance profile's ARN.
  returned: always
  type: str
profile_exists:
  description: Whether the instance profile exists after the run (false in check mode when the run would make it).
  returned: always
  type: bool
policy_name:
  description: The name of the role's inline policy.
  returned: always
  type: str
tags:
  description: The tags the role and profile carry (C(calque:pool)).
  returned: always
  type: dict
key_base:
  description: The S3 key prefix every object of the pool lives under.
  returned: always
  type: str
trust_policy:
  description: The role's trust policy document.
  returned: always
  type: dict
worker_policy:
  description: The role's inline policy document.
  returned: always
  type: dict
controller_policy:
  description: What the controller's credentials need to run C(playbooks/pool.yml) for this pool.
  returned: always
  type: dict
"""

from ansible_collections.amazon.aws.plugins.module_utils.modules import AnsibleAWSModule
from ansible_collections.calque.gpu.plugins.module_utils._ops import run_op


def main():
    argument_spec = dict(
        pool=dict(type="str", required=True),
        bucket=dict(type="str", required=True),
        prefix=dict(type="str", default="calque"),
        state=dict(type="str", choices=["present", "absent"], default="present"),
    )
    run_op(AnsibleAWSModule, "pool_iam", argument_spec)


if __name__ == "__main__":
    main()

#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, calque developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: pool_iam_policy
short_description: The IAM names and policy documents of a calque pool's workers and controller
version_added: 0.1.0
description:
  - Renders, from the pool's name, the workers' role name, instance profile name, inline policy name
    and tags, the role's trust policy (EC2 may assume it), the role's inline policy and the policy the
    controller needs to run C(playbooks/pool.yml) for the pool (including C(iam:PassRole) for that
    role alone).
  - The workers' policy allows the pool's own queue (receive, delete, change visibility, get the
    attributes and the URL, send), its own keys in the bucket (get, put, delete, and a listing
    limited to those keys) and its own Auto Scaling group (scale-in protection and the lifecycle
    action, for the group tagged C(calque:pool=<pool>)), nothing else.
  - Facts only, no AWS call; M(calque.gpu.pool_iam) makes the role, policy and profile from the same documents.
  - A thin face over the C(calque.ops.pool_iam_policy) operation (C(calque.aws.iam_policy)); the CLI's
    C(calque pool iam-policy) prints the same documents.
author: calque developers (@calque)
options:
  pool:
    description:
      - The pool's name, for example V(lab-a/embedder) (1 to 3 segments of a-z, 0-9 and C(-) joined by C(/)).
    type: str
    required: true
  bucket:
    description:
      - The pool's S3 bucket.
    type: str
    required: true
  region:
    description:
      - The pool's AWS region, for example V(us-east-1).
    type: str
    required: true
  account:
    description:
      - The AWS account id, 12 digits (M(amazon.aws.aws_caller_info) returns it).
    type: str
    required: true
  prefix:
    description:
      - The key prefix of the pool's objects in the bucket (the pool spec's C(prefix)).
    type: str
    default: calque
extends_documentation_fragment:
  - calque.gpu.runtime
  - calque.gpu.attributes
  - calque.gpu.attributes.changes_nothing
attributes:
  check_mode:
    support: full
    details: Renders only; the same in check mode.
"""

EXAMPLES = r"""
- name: Who am I
  amazon.aws.aws_caller_info:
  register: __caller

- name: The pool's IAM documents
  calque.gpu.pool_iam_policy:
    pool: lab-a/embedder
    bucket: lab-a-calque-runs
    region: us-east-1
    account: "{{ __caller.account }}"
  register: __iam

- name: The workers' role
  amazon.aws.iam_role:
    name: "{{ __iam.role_name }}"
    assume_role_policy_document: "{{ __iam.trust_policy | to_json }}"
    create_instance_profile: false
    delete_instance_profile: false
    tags: "{{ __iam.tags }}"
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
policy_name:
  description: The name of the role's inline policy.
  returned: always
  type: str
tags:
  description: The tags every resource of the pool carries (C(calque:pool)).
  returned: always
  type: dict
key_base:
  description: The S3 key prefix every object of the pool lives under.
  returned: always
  type: str
  sample: calque/pools/calque-lab-a-embedder-a22b957d
trust_policy:
  description: The role's trust policy document.
  returned: always
  type: dict
worker_policy:
  description: The role's inline policy document.
  returned: always
  type: dict
controller_policy:
  description: The policy document a person running pool.yml for this pool needs.
  returned: always
  type: dict
pool:
  description: The pool's name.
  returned: always
  type: str
account:
  description: The account id given.
  returned: always
  type: str
region:
  description: The region given.
  returned: always
  type: str
bucket:
  description: The bucket given.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.calque.gpu.plugins.module_utils._ops import run_op


def main():
    argument_spec = dict(
        pool=dict(type="str", required=True),
        bucket=dict(type="str", required=True),
        region=dict(type="str", required=True),
        account=dict(type="str", required=True),
        prefix=dict(type="str", default="calque"),
    )
    run_op(AnsibleModule, "pool_iam_policy", argument_spec)


if __name__ == "__main__":
    main()

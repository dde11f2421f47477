#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, calque developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: session_fleet_iam_policy
short_description: The IAM names and policy documents of an elastic class of calque session hosts
version_added: 0.1.0
description:
  - Renders, from the class's name and where its munge key lives, the hosts' role, instance profile and inline
    policy names, their tags, the trust policy (EC2 may assume the role), the hosts' inline policy and the policy
    the broker's credentials need.
  - The hosts' policy allows reading the institution's munge key at the one place named (C(ssm:GetParameter) on
    that SecureString, or C(s3:GetObject) on that object, and C(kms:Decrypt) of its key through that service),
    writing their own registration under C(/calque/session-fleet/<class>/hosts/), and scale-in protection and
    the drain's lifecycle action on their own group; nothing else.
  - The broker's policy allows C(cloudwatch:PutMetricData) into C(calque/session) only and
    C(ssm:GetParametersByPath) under the class's registration path.
  - Facts only, no AWS call. A thin face over C(calque.ops.session_fleet_iam_policy) (C(calque.aws.fleet_iam)).
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
        your own encrypts it. Unset renders the names only (a teardown), with a policy that reads no key.
    type: dict
  bucket:
    description:
      - The bucket the class's runtime is staged in.
    type: str
    required: true
  region:
    description:
      - The class's AWS region.
    type: str
    required: true
  account:
    description:
      - The AWS account id, 12 digits (M(amazon.aws.aws_caller_info) returns it).
    type: str
    required: true
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
- name: The teaching class's IAM documents
  calque.gpu.session_fleet_iam_policy:
    fleet_class: teaching-rtx6000
    munge_key:
      ssm_parameter: /calque/institution/munge-key
    bucket: teaching-calque-runtime
    region: us-east-1
    account: "{{ __caller.account }}"
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
tags:
  description: The tags the class's IAM resources carry (C(calque:pool), C(calque:session-class)).
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.calque.gpu.plugins.module_utils._ops import run_op


def main():
    argument_spec = dict(
        fleet_class=dict(type="str", required=True),
        munge_key=dict(type="dict", no_log=False),  # where the key lives, not the key
        bucket=dict(type="str", required=True),
        region=dict(type="str", required=True),
        account=dict(type="str", required=True),
    )
    run_op(AnsibleModule, "session_fleet_iam_policy", argument_spec)


if __name__ == "__main__":
    main()

#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, calque developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: session_fleet_user_data
short_description: The user-data that makes an instance of a class a calque session host, without Ansible
version_added: 0.1.0
description:
  - Stages this controller's calque wheel (and its pinned wheelhouse) in O(bucket) as M(calque.gpu.pool_spec) does,
    and renders the class's user-data from O(spec) (a C(SessionHostSpec)).
  - At first boot the instance installs the runtime, writes the class's session config, institution file and MIG
    layout, installs the institution's munge key from the SSM SecureString or S3 object named in the C(munge_key) of O(spec),
    applies the layout through C(calque-gpu.service), starts C(calque-session.service) named for the instance and
    listening on its private address, registers with the broker and starts the fleet helper
    (C(calque session fleet protect)).
  - Check mode stages nothing; its user-data is the real run's. A thin face over
    C(calque.ops.session_fleet_user_data) (C(calque.session.fleet.userdata)).
author: calque developers (@calque)
options:
  spec:
    description:
      - The class's C(SessionHostSpec) fields, C(fleet_class), C(region), C(endpoint_url), C(session_config),
        C(institution), C(mig_configs), C(mig_config), C(offers), C(port), C(munge_key), C(protect_every),
        C(drain_hold).
    type: dict
    required: true
  bucket:
    description:
      - The bucket the runtime is staged in; unset only with O(runtime_pip).
    type: str
  prefix:
    description:
      - The key prefix of the staged runtime (under C(<prefix>/runtime/)).
    type: str
    default: calque
  runtime_ttl:
    description:
      - How long the presigned runtime URLs stay valid (the launch template is renewed before they expire).
    type: str
    default: 7d
  runtime_wheelhouse:
    description:
      - Stage the pinned wheelhouse beside the wheel (no index needed on the instance).
    type: bool
    default: true
  runtime_pip:
    description:
      - A pip requirement the instance installs instead of the staged runtime.
    type: str
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
    details: Stages nothing; the user-data is the one the real run returns.
  diff_mode:
    support: full
    details: Shows the staged runtime's objects before and after.
  idempotent:
    support: full
    details: An identical wheel or wheelhouse is not uploaded again.
"""

EXAMPLES = r"""
- name: The teaching class's user-data
  calque.gpu.session_fleet_user_data:
    bucket: teaching-calque-runtime
    spec:
      fleet_class: teaching-rtx6000
      region: us-east-1
      institution: "{{ calque_session_institution }}"
      offers: [1g.24gb]
      munge_key:
        ssm_parameter: /calque/institution/munge-key
"""

RETURN = r"""
user_data:
  description: The user-data script.
  returned: always
  type: str
runtime:
  description: The staged runtime (bucket, keys, presigned URLs, sha256s); null with O(runtime_pip).
  returned: always
  type: dict
offers:
  description: What each host of the class offers.
  returned: always
  type: list
  elements: str
"""

from ansible_collections.amazon.aws.plugins.module_utils.modules import AnsibleAWSModule
from ansible_collections.calque.gpu.plugins.module_utils._ops import run_op


def main():
    argument_spec = dict(
        spec=dict(type="dict", required=True),
        bucket=dict(type="str"),
        prefix=dict(type="str", default="calque"),
        runtime_ttl=dict(type="str", default="7d"),
        runtime_wheelhouse=dict(type="bool", default=True),
        runtime_pip=dict(type="str"),
    )
    run_op(AnsibleAWSModule, "session_fleet_user_data", argument_spec)


if __name__ == "__main__":
    main()

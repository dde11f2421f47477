#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, calque developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: session_fleet_scaling
short_description: How an elastic class of calque session hosts grows on waiting requests and shrinks on idle hosts
version_added: 0.1.0
description:
  - For the Auto Scaling group of session-host class O(fleet_class) (made by M(calque.gpu.pool_group) as pool
    C(fleet/<class>)), a step scaling policy and alarm C(<base>-demand) on the broker's metric
    C(calque/session UnservedRequests) (dimension C(Class)) that adds one host per O(slices_per_host) requests
    waiting unserved, at most O(max_step) at once; a policy and alarm C(<base>-idle) that removes one host after
    O(idle_s) with at least one idle host (C(IdleHosts)); the termination lifecycle hook C(calque-drain), which
    holds a leaving host while it drains, up to O(drain_timeout_s).
  - Scale-in ends only unprotected instances, and a host with a live session protects itself
    (C(calque session fleet protect) on the host), so scale-in never ends a session.
  - Compares only the fields calque sets, so a second run changes nothing; check mode is the same plan, unapplied.
    Refuses a group or alarm tagged for another pool. O(state=absent) deletes the alarms, policies and hook.
  - A thin face over the C(calque.ops.session_fleet_scaling) operation (C(calque.aws.acquire.fleet_scaling)).
author: calque developers (@calque)
options:
  fleet_class:
    description:
      - The session-host class, for example V(teaching-rtx6000) (1 to 40 of a-z, 0-9 and C(-)).
    type: str
    required: true
  state:
    description:
      - V(present) sets the scaling; V(absent) removes it and leaves the group.
    type: str
    choices: [present, absent]
    default: present
  slices_per_host:
    description:
      - Slices one host of the class offers (its MIG layout), which is the number of unserved requests one added host answers.
    type: int
    default: 1
  boot_s:
    description:
      - Seconds from launch to a host registered with the broker (the policy's C(EstimatedInstanceWarmup)).
    type: int
    default: 420
  idle_s:
    description:
      - Seconds with at least one idle host before the class scales in by one.
    type: int
    default: 1200
  drain_timeout_s:
    description:
      - Seconds the C(calque-drain) hook holds a leaving host while its sessions end (AWS's most is 7200).
    type: int
    default: 7200
  max_step:
    description:
      - The most hosts one scale-out step adds.
    type: int
    default: 10
  keep_drain_hook:
    description:
      - With O(state=absent), keep the C(calque-drain) hook, so that a teardown that drains the group next still holds
        each leaving host while it drains (the hook goes with the group).
    type: bool
    default: false
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
    details: Plans every policy, alarm and hook (also before the group exists, with a warning) without writing.
  diff_mode:
    support: full
    details: Shows the policies, alarms and hook before and after, in the fields calque sets.
  idempotent:
    support: full
    details: Compares each part with what exists; parts that match are not written.
"""

EXAMPLES = r"""
- name: Scale the teaching class on its waiting requests
  calque.gpu.session_fleet_scaling:
    fleet_class: teaching-rtx6000
    slices_per_host: 4
    idle_s: 1200
"""

RETURN = r"""
group_name:
  description: The class's Auto Scaling group.
  returned: always
  type: str
policies:
  description: The scaling policies after the run.
  returned: always
  type: list
  elements: str
alarms:
  description: The CloudWatch alarms after the run.
  returned: always
  type: list
  elements: str
lifecycle_hooks:
  description: The lifecycle hooks after the run.
  returned: always
  type: list
  elements: str
steps:
  description: The demand policy's step adjustments.
  returned: always
  type: list
  elements: dict
"""

from ansible_collections.amazon.aws.plugins.module_utils.modules import AnsibleAWSModule
from ansible_collections.calque.gpu.plugins.module_utils._ops import run_op


def main():
    argument_spec = dict(
        fleet_class=dict(type="str", required=True),
        state=dict(type="str", choices=["present", "absent"], default="present"),
        slices_per_host=dict(type="int", default=1),
        boot_s=dict(type="int", default=420),
        idle_s=dict(type="int", default=1200),
        drain_timeout_s=dict(type="int", default=7200),
        max_step=dict(type="int", default=10),
        keep_drain_hook=dict(type="bool", default=False),
    )
    run_op(AnsibleAWSModule, "session_fleet_scaling", argument_spec)


if __name__ == "__main__":
    main()

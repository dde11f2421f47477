#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, calque developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: pool_scaling
short_description: Scale a calque pool's Auto Scaling group on its queue backlog, down to zero and back
version_added: 0.1.0
description:
  - Sets how the Auto Scaling group of a named pool (O(pool)) follows the pool's SQS queue.
  - A target-tracking policy on backlog per instance, CloudWatch metric math
    C((ApproximateNumberOfMessagesVisible + ApproximateNumberOfMessagesNotVisible) / GroupInServiceInstances).
    Its target is C(max(1, floor(latency_s / seconds_per_claim))) claims per instance.
  - Out of zero, a step policy (exact capacity 1) on an alarm that fires while claims are visible and
    no instance is in service; backlog per instance is undefined at zero, so target tracking cannot.
  - Down to zero, a step policy (exact capacity 0) on an alarm that fires after O(idle_s) with nothing
    visible or in flight.
  - A termination lifecycle hook C(calque-drain) holds a terminating instance until its worker has
    released its claims and run C(@exit), or O(drain_timeout_s) passes.
  - Turns on the group's 1-minute C(GroupInServiceInstances) and C(GroupDesiredCapacity) metrics.
  - The group itself (template, min and max size) is made by C(calque.gpu.pool_group); a group tagged
    C(calque:pool) for another pool is refused. A thin face over the C(calque.ops.pool_scaling)
    operation (C(calque.aws.acquire.scaling)).
author: calque developers (@calque)
options:
  pool:
    description:
      - The pool's name, for example V(lab-a/embedder); every resource name derives from it.
    type: str
    required: true
  state:
    description:
      - V(present) puts the policies, alarms and hook; V(absent) deletes them and leaves the group.
    type: str
    choices: [present, absent]
    default: present
  seconds_per_claim:
    description:
      - Measured seconds one claim takes on this pool (the C(claim_seconds) of its Summaries).
      - Required with O(state=present).
    type: float
  latency_s:
    description:
      - Seconds a submitted claim may wait for a worker. Required with O(state=present).
    type: float
  idle_s:
    description:
      - Seconds with nothing visible or in flight before the group scales to zero, C(60..86400),
        rounded up to whole minutes.
    type: int
    default: 900
  warmup_s:
    description:
      - Seconds a new instance needs (boot, bootstrap, C(@enter)) before its metrics count, C(0..3600).
    type: int
    default: 300
  drain_timeout_s:
    description:
      - Seconds the termination lifecycle hook waits for a worker to drain, C(30..7200).
    type: int
    default: 300
  buffer:
    description:
      - Instances kept in service beyond what the backlog needs while the pool is active (Modal's
        C(buffer_containers), per instance); the target tracking metric counts O(buffer) x target more claims.
      - The idle alarm still takes the group to its minimum after O(idle_s) with nothing to do.
    type: int
    default: 0
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
    details: Shows the policies, alarms, hook and group metrics before and after, in the fields calque sets.
  idempotent:
    support: full
    details: Compares each part with what exists; parts that match are not written.
"""

EXAMPLES = r"""
- name: Scale lab A's embedder pool on its backlog, to zero after 15 idle minutes
  calque.gpu.pool_scaling:
    pool: lab-a/embedder
    seconds_per_claim: 12.5
    latency_s: 300
    idle_s: 900

- name: Remove the scaling (the group stays at its current size)
  calque.gpu.pool_scaling:
    pool: lab-a/embedder
    state: absent
"""

RETURN = r"""
group_name:
  description: The pool's Auto Scaling group.
  returned: always
  type: str
  sample: calque-lab-a-embedder-a22b957d
target_backlog_per_instance:
  description: The target-tracking target, claims per in-service instance; null when absent.
  returned: always
  type: int
  sample: 24
policies:
  description: The scaling policies after the run.
  returned: always
  type: list
  elements: str
  sample: [calque-lab-a-embedder-a22b957d-backlog, calque-lab-a-embedder-a22b957d-idle, calque-lab-a-embedder-a22b957d-wake]
alarms:
  description: The CloudWatch alarms after the run.
  returned: always
  type: list
  elements: str
  sample: [calque-lab-a-embedder-a22b957d-idle, calque-lab-a-embedder-a22b957d-wake]
lifecycle_hooks:
  description: The lifecycle hooks after the run.
  returned: always
  type: list
  elements: str
  sample: [calque-drain]
"""

from ansible_collections.amazon.aws.plugins.module_utils.modules import AnsibleAWSModule
from ansible_collections.calque.gpu.plugins.module_utils._ops import run_op


def main():
    argument_spec = dict(
        pool=dict(type="str", required=True),
        state=dict(type="str", choices=["present", "absent"], default="present"),
        seconds_per_claim=dict(type="float"),
        latency_s=dict(type="float"),
        idle_s=dict(type="int", default=900),
        warmup_s=dict(type="int", default=300),
        drain_timeout_s=dict(type="int", default=300),
        buffer=dict(type="int", default=0),
    )
    run_op(AnsibleAWSModule, "pool_scaling", argument_spec)


if __name__ == "__main__":
    main()

#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, calque developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: ec2_cohort
short_description: A named cohort of EC2 GPU instances, acquired across types and AZs behind a spend gate
version_added: 0.1.0
description:
  - Brings the cohort O(name) (the EC2 instances tagged C(calque:cohort=<name>)) to O(count)
    instances, or terminates all of them with O(state=absent).
  - Idempotent by count - it counts the cohort's live instances and launches only the difference; a lower
    O(count) terminates the newest instances first. Only instances carrying the cohort's tag are ever
    terminated.
  - Launches sweep O(instance_types) and O(subnets) in the order given, in parallel across subnets,
    moving on when EC2 has no capacity (C(InsufficientInstanceCapacity), C(Unsupported), spot price and
    count errors) or the vCPU quota is reached. With O(market=spot-then-on-demand) spot is tried
    everywhere first.
  - Every instance gets IMDSv2 required (hop limit 2), an encrypted root volume, shutdown behaviour
    C(terminate) and a hard TTL - a boot hook powers it off at the time in its C(calque:expires-at) tag,
    and powering off terminates it.
  - Launching requires O(i_understand_this_spends_money=true); terminating requires
    O(i_understand_this_terminates_instances=true). A cohort whose worst-case hourly cost (O(count) times
    the on-demand rate of the dearest listed type) exceeds O(max_hourly_usd) is refused, with the
    arithmetic in the message.
  - A thin face over the C(calque.ops.ec2_cohort) operation and C(calque.aws.acquire.Acquirer), the only code in
    calque that launches or terminates instances.
author: calque developers (@calque)
options:
  name:
    description:
      - The cohort's name, the value of its C(calque:cohort) tag. Letters, digits, C(.), C(_) and C(-),
        at most 63 characters.
    type: str
    required: true
  state:
    description:
      - V(present) brings the cohort to O(count) instances; V(absent) terminates all of them.
    type: str
    choices: [present, absent]
    default: present
  count:
    description:
      - Instances the cohort should have. Required with O(state=present).
    type: int
  min_viable:
    description:
      - Fewest instances that count as success when capacity is short. The module fails below it (and,
        with O(cleanup_on_failure=true), terminates what the failed attempt launched). Defaults to O(count).
      - Must not be more than O(count).
    type: int
  instance_types:
    description:
      - EC2 instance types in order of preference. Must not be empty; each must be in calque's rates table.
    type: list
    elements: str
  subnets:
    description:
      - Subnet ids in order of preference, typically one per availability zone. Empty uses the default VPC.
    type: list
    elements: str
    default: []
  market:
    description:
      - V(on-demand), V(spot), or V(spot-then-on-demand) (spot in every candidate first, then on-demand).
    type: str
    choices: [on-demand, spot, spot-then-on-demand]
    default: on-demand
  spot_max_price:
    description:
      - Highest spot price in USD per hour. Unset caps spot at the on-demand price.
    type: float
  user_data:
    description:
      - Extra user-data, a shell script or a C(#cloud-config) document. It runs after calque's TTL boot
        hook (calque builds the MIME multipart, so do not give one).
    type: str
  ttl:
    description:
      - Hard lifetime of each instance, in seconds or as V(90m), V(3h), V(1d). At most 14 days.
    type: str
    default: 3h
  tags:
    description:
      - Extra tags for the instances and their volumes. Keys starting C(calque:) are reserved.
    type: dict
    default: {}
  pool:
    description:
      - Value of the C(calque:pool) tag, naming the warm pool the instances serve.
    type: str
  owner:
    description:
      - Value of the C(calque:owner) tag. Defaults to the user running the module.
    type: str
  max_hourly_usd:
    description:
      - Refuse a cohort whose worst-case on-demand cost per hour is more than this.
    type: float
  i_understand_this_spends_money:
    description:
      - Must be V(true) for the module to launch instances; they bill until they end.
    type: bool
    default: false
  i_understand_this_terminates_instances:
    description:
      - Must be V(true) for the module to terminate instances (a lower O(count), or O(state=absent)).
    type: bool
    default: false
  cleanup_on_failure:
    description:
      - When a launch attempt fails (fewer than O(min_viable), an EC2 error, a wait timeout), terminate
        the instances that attempt launched.
    type: bool
    default: true
  wait:
    description:
      - Wait until launched instances are running (or, with O(state=absent), terminated).
    type: bool
    default: true
  wait_timeout:
    description:
      - Seconds to wait, C(1..3600).
    type: int
    default: 600
notes:
  - The cohort is reconciled by count only. Changing O(instance_types), O(tags), O(ttl) or other launch
    settings does not alter instances already running; instances launched later get the new settings.
  - Rates come from the C(calque) runtime's table of us-east-1 on-demand list prices; spot cohorts are
    gated at the on-demand rate, the most they can cost.
  - The vCPU quota is read from Service Quotas where the credentials allow; otherwise the module warns
    and lets EC2 enforce it.
extends_documentation_fragment:
  - calque.gpu.launch
  - calque.gpu.runtime
  - calque.gpu.offline
  - calque.gpu.attributes
  - amazon.aws.common.modules
  - amazon.aws.region.modules
  - amazon.aws.boto3
attributes:
  check_mode:
    support: full
    details: Reports the instances that would be launched or terminated and the hourly cost, calling no write API.
  diff_mode:
    support: full
    details: Shows the cohort's instance count (and instance ids) before and after.
  idempotent:
    support: full
    details: A second run with the same options finds the cohort at O(count) and reports RV(ignore:changed=false).
"""

EXAMPLES = r"""
- name: Four L4 instances for the llama pool, across three AZs, L40S if L4 is short
  calque.gpu.ec2_cohort:
    name: llama-pool
    count: 4
    min_viable: 2
    instance_types: [g6.xlarge, g6e.xlarge]
    subnets: [subnet-0aaa, subnet-0bbb, subnet-0ccc]
    market: spot-then-on-demand
    instance_profile: calque-worker
    security_groups: [sg-0123]
    ttl: 8h
    pool: meta-llama/Llama-3.1-8B-Instruct
    max_hourly_usd: 10
    i_understand_this_spends_money: true
  register: cohort

- name: Scale the cohort down to one (the newest instances end first)
  calque.gpu.ec2_cohort:
    name: llama-pool
    count: 1
    instance_types: [g6.xlarge, g6e.xlarge]
    i_understand_this_terminates_instances: true

- name: Terminate the whole cohort
  calque.gpu.ec2_cohort:
    name: llama-pool
    state: absent
    i_understand_this_terminates_instances: true
"""

RETURN = r"""
instances:
  description: The cohort's live instances after the run (before it, in check mode).
  returned: always
  type: list
  elements: dict
  contains:
    instance_id:
      description: EC2 instance id.
      type: str
      sample: i-0123456789abcdef0
    instance_type:
      description: Instance type.
      type: str
      sample: g6.xlarge
    availability_zone:
      description: Availability zone.
      type: str
      sample: us-east-1a
    subnet_id:
      description: Subnet id.
      type: str
    private_ip:
      description: Private IPv4 address.
      type: str
    public_ip:
      description: Public IPv4 address, if any.
      type: str
    lifecycle:
      description: V(spot) or V(on-demand).
      type: str
    state:
      description: EC2 state name.
      type: str
    launch_time:
      description: Launch time, ISO 8601.
      type: str
    expires_at:
      description: When the instance powers itself off (its C(calque:expires-at) tag), ISO 8601.
      type: str
hourly_usd:
  description:
    - On-demand USD per hour of the cohort after the run. In check mode, of the planned cohort at the
      dearest listed type (the figure the spend gate checks).
  returned: always
  type: float
  sample: 3.2192
launched:
  description: Ids of the instances this run launched.
  returned: always
  type: list
  elements: str
terminated:
  description: Ids of the instances this run terminated (none in check mode; RV(plan.terminate) lists those it would).
  returned: always
  type: list
  elements: str
shortfall:
  description: Instances short of O(count) (non-zero only when O(min_viable) allowed a partial cohort).
  returned: always
  type: int
  sample: 0
plan:
  description: What the run does or, in check mode, would do.
  returned: always
  type: dict
  contains:
    current:
      description: Live instances before the run.
      type: int
    target:
      description: Instances wanted (0 for O(state=absent)).
      type: int
    launch:
      description: Instances to launch.
      type: int
    terminate:
      description: Ids of instances to terminate, newest first.
      type: list
      elements: str
    spend:
      description: The spend gate's arithmetic as a sentence.
      type: str
      sample: 4 x g6e.xlarge at $1.8610/h = $7.44/h <= max_hourly_usd $10.00/h
attempts:
  description: The RunInstances calls of the capacity sweep and their outcomes.
  returned: always
  type: list
  elements: dict
"""

from ansible_collections.amazon.aws.plugins.module_utils.modules import AnsibleAWSModule
from ansible_collections.calque.gpu.plugins.module_utils._launch import LAUNCH_MUTUALLY_EXCLUSIVE, LAUNCH_OPTIONS
from ansible_collections.calque.gpu.plugins.module_utils._ops import run_op


def main():
    argument_spec = dict(
        name=dict(type="str", required=True),
        state=dict(type="str", choices=["present", "absent"], default="present"),
        count=dict(type="int"),
        min_viable=dict(type="int"),
        instance_types=dict(type="list", elements="str"),
        subnets=dict(type="list", elements="str", default=[]),
        market=dict(type="str", choices=["on-demand", "spot", "spot-then-on-demand"], default="on-demand"),
        spot_max_price=dict(type="float"),
        user_data=dict(type="str"),
        ttl=dict(type="str", default="3h"),
        tags=dict(type="dict", default={}),
        pool=dict(type="str"),
        owner=dict(type="str"),
        max_hourly_usd=dict(type="float"),
        i_understand_this_spends_money=dict(type="bool", default=False),
        i_understand_this_terminates_instances=dict(type="bool", default=False),
        cleanup_on_failure=dict(type="bool", default=True),
        wait=dict(type="bool", default=True),
        wait_timeout=dict(type="int", default=600),
    )
    argument_spec.update(LAUNCH_OPTIONS)
    run_op(
        AnsibleAWSModule,
        "ec2_cohort",
        argument_spec,
        required_if=[("state", "present", ("count", "instance_types"))],
        mutually_exclusive=LAUNCH_MUTUALLY_EXCLUSIVE,
    )


if __name__ == "__main__":
    main()

#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, calque developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: pool_group
short_description: A calque pool's launch template and EC2 Auto Scaling group, behind the spend gate
version_added: 0.1.0
description:
  - Creates, sizes, rolls and deletes the instances of one named calque pool as an EC2 Auto Scaling group
    with a versioned launch template, through calque's Acquirer (C(calque.ops.pool_group)).
  - The group and template are named from O(pool) (C(calque-<slug>-<hash>)) and tagged C(calque:pool);
    a group or template tagged for another pool is refused, never adopted or deleted.
  - The launch template requires IMDSv2 (hop limit 2), encrypts the root volume and carries the pool's
    bootstrap O(user_data). A new template version is made only when what instances are bootstrapped with
    changes (AMI, user-data, types, profile, security groups, volume); instances launched from an older
    version are then rolled by an instance refresh that keeps O(min_healthy_percentage) in service.
  - The group uses a MixedInstancesPolicy over O(instance_types) across O(subnets); with O(market=spot),
    spot C(price-capacity-optimized) above an on-demand base of O(on_demand_base), and capacity
    rebalancing. A O(ttl) of a day or more becomes the group's C(MaxInstanceLifetime); a shorter one
    powers each instance off O(ttl) after its first boot.
  - With O(warm), an EC2 Auto Scaling warm pool of instances that ran the bootstrap up to "ready" and then
    stopped (or hibernated, or keep running), and the C(calque-ready) lifecycle hook on
    C(autoscaling:EC2_INSTANCE_LAUNCHING) that the bootstrap completes CONTINUE once ready, ABANDON on failure.
    AWS refuses a warm pool beside a mixed instances policy or Spot, so O(warm) needs O(market=on-demand) and
    one instance type; the group then names its launch template directly. Changing O(warm) is one
    C(PutWarmPool), never a new template version or a roll (except V(Hibernated), which the template enables).
  - O(schedule) windows become Auto Scaling scheduled actions raising the group's minimum before a known
    busy time and lowering it back to O(min_size) after.
  - The spend gate prices the worst case, O(max_size) instances of the dearest allowed type, against
    O(max_hourly_usd) before anything is read or made; launching needs O(i_understand_this_spends_money),
    lowering the count or rolling needs O(i_understand_this_terminates_instances).
  - Check mode validates what the real run needs; the AMI (or its SSM parameter), the instance profile,
    subnets and security groups must exist, and EC2 must accept a DryRun launch.
author: calque developers (@calque)
options:
  pool:
    description:
      - The pool's name (for example V(lab-a/embedder)); every AWS name derives from it.
    type: str
    required: true
  state:
    description:
      - V(present) makes the group match the options; V(absent) drains it to zero (each instance's
        termination lifecycle hook lets its worker release its claims), then deletes it and the template.
    type: str
    choices: [present, absent]
    default: present
  count:
    description:
      - Desired instances. Unset leaves the desired count to scaling policies (a new group starts at O(min_size)).
    type: int
  min_size:
    description: Fewest instances the group keeps.
    type: int
    default: 0
  max_size:
    description: Most instances the group may have (what the spend gate prices). Defaults to O(count).
    type: int
  instance_types:
    description: Instance types in order of preference (required with O(state=present)).
    type: list
    elements: str
  subnets:
    description: Subnet ids (one per AZ). Empty uses every available AZ of the default VPC.
    type: list
    elements: str
    default: []
  market:
    description: V(spot) (above O(on_demand_base)) or V(on-demand).
    type: str
    choices: [spot, on-demand]
    default: spot
  on_demand_base:
    description: Instances that are always on-demand, before spot.
    type: int
    default: 0
  user_data:
    description: The workers' bootstrap (calque.gpu.pool_spec's RV(calque.gpu.pool_spec#module:user_data)).
    type: str
  ttl:
    description: Each instance's lifetime (C(90m), C(3h), C(2d)).
    type: str
    default: 3h
  tags:
    description: Extra tags for the group, template and instances. Keys starting C(calque:) are reserved.
    type: dict
    default: {}
  min_healthy_percentage:
    description: During a roll, the share of the desired count kept in service, C(0..100).
    type: int
    default: 90
  instance_warmup:
    description: Seconds a new instance gets before a roll counts it healthy, C(0..3600).
    type: int
    default: 300
  max_hourly_usd:
    description: Refuse a group whose worst case (max size x dearest type, on-demand) costs more per hour.
    type: float
  lab_budget:
    description:
      - The monthly budget of the pool's lab (the first segment of O(pool)), as C(calque_labs) gives it.
      - Once the lab's month to date (every instance of its pools' groups this month at its type's rate, from the
        usage records the instances wrote) reaches it, or while the broker holds any of the lab's pools for the
        month (its sessions and pools together are over), the gate refuses, naming the budget and who can raise it.
    type: dict
    suboptions:
      gpu_hours:
        description: GPU-hours per calendar month (UTC).
        type: float
      usd:
        description: Dollars per calendar month at EC2 on-demand rates.
        type: float
      notify_at:
        description: The share of the budget at which the lab is told (by the broker's mail).
        type: float
        default: 0.8
      raised_by:
        description: Who can raise the budget (named in the refusal).
        type: str
        default: your institution's GPU administrators
  lab_spent_elsewhere:
    description:
      - Deprecated and ignored. The lab's sessions are no longer typed in here - the broker's ledger sums them with
        the lab's pools, and holds the pools of a lab over its budget (C(calque:budget-hold)); this gate refuses
        while it does.
    type: float
    default: 0.0
  bucket:
    description:
      - The pool's bucket. Its instances write their usage records under O(prefix) there; the group is tagged
        C(calque:usage) with that place so the ledger and the lab's gate find them after the instances are gone.
    type: str
  prefix:
    description: The pool's key prefix in O(bucket).
    type: str
    default: calque
  i_understand_this_spends_money:
    description: Must be V(true) to create a group with instances or raise its count.
    type: bool
    default: false
  i_understand_this_terminates_instances:
    description: Must be V(true) to lower the count, roll instances or drain the group.
    type: bool
    default: false
  gate_only:
    description:
      - Only price the worst case and check the consents, changing nothing (pool.yml's first task, so a
        refused pool makes no bucket or queue).
    type: bool
    default: false
  wait_timeout:
    description: Seconds V(absent) waits for the group to drain before it reports a failure.
    type: int
    default: 600
  warm:
    description:
      - The pool's EC2 warm pool (C(calque_pool_warm) in pool.yml); omit for none (an existing one is deleted).
      - Its O(warm.min_size) instances are priced by the spend gate beside O(max_size), since each runs while it bootstraps.
    type: dict
    suboptions:
      state:
        description:
          - What a warmed instance waits as. V(Stopped) keeps the disk (the runtime, the workload, its weight
            cache) and bills only its EBS volumes; V(Running) bills the instance; V(Hibernated) also keeps RAM
            but only instance families AWS lists for hibernation can (no GPU family, see docs/pool.md).
        type: str
        choices: [Stopped, Hibernated, Running]
        default: Stopped
      min_size:
        description: Instances kept warmed, whatever the group's size.
        type: int
        default: 1
      max_prepared:
        description: Most instances warmed or in service together (C(MaxGroupPreparedCapacity)); omit for O(max_size).
        type: int
      reuse_on_scale_in:
        description: Scale-in returns instances to the warm pool instead of terminating them (C(ReuseOnScaleIn)).
        type: bool
        default: true
      ready_timeout:
        description: Seconds the C(calque-ready) hook waits for the bootstrap to reach ready before abandoning the launch.
        type: int
        default: 1800
  schedule:
    description: Recurring windows of warmth (C(calque_pool_schedule) in pool.yml), two scheduled actions each.
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description: Names the window's actions (C(calque-sched-<name>-start), C(-end)); lowercase, digits, dashes.
        type: str
        required: true
      at:
        description: The window's start as a 5-field cron (C(0 10 * * 1-5)); minute and hour as numbers.
        type: str
        required: true
      duration:
        description: How long the window lasts (C(2h)), at most a day.
        type: str
        required: true
      instances:
        description: The group's minimum during the window.
        type: int
        default: 1
      lead:
        description: How early the instances are asked for (C(10m)).
        type: str
        default: 10m
      timezone:
        description: The cron's IANA time zone.
        type: str
        default: UTC
  capacity_block:
    description:
      - An EC2 Capacity Block for ML to launch into, by its capacity reservation id (C(cr-...)), bought in EC2 for
        the block's one instance type, Availability Zone and dates.
      - The launch template gets C(InstanceMarketOptions.MarketType=capacity-block) and the block as its
        C(CapacityReservationSpecification) target, and the group names the template alone (no mixed instances policy).
      - Needs O(market=on-demand), exactly one O(instance_types) (the block's) and no O(warm); O(subnets) must be in
        the block's Availability Zone. Outside the block's dates EC2 launches nothing.
    type: str
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
    details: Plans, validates (AMI, profile, subnets, security groups, EC2 DryRun) and reports, calling no write API.
  diff_mode:
    support: full
    details: >-
      Shows the config digest, template version, desired count, the instances that will roll or be replaced,
      and the warm pool, launching hook and scheduled windows before and after.
  idempotent:
    support: full
    details: A second run with the same options finds template and group unchanged and reports RV(ignore:changed=false).
"""

EXAMPLES = r"""
- name: A lab's pool on spot GPUs, up to 4 instances
  calque.gpu.pool_group:
    pool: lab-a/embedder
    count: 2
    max_size: 4
    instance_types: [g6.xlarge, g5.xlarge]
    subnets: [subnet-0a, subnet-0b]
    instance_profile: calque-lab-a-embedder-1a2b3c4d-worker
    user_data: "{{ spec_file.user_data }}"
    max_hourly_usd: 10
    i_understand_this_spends_money: true

- name: The same pool on demand with two warmed (stopped) instances, and a class at 10:00 on weekdays
  calque.gpu.pool_group:
    pool: lab-a/embedder
    count: 0
    max_size: 4
    market: on-demand
    instance_types: [g6.xlarge]
    user_data: "{{ spec_file.user_data }}"
    max_hourly_usd: 10
    warm: {state: Stopped, min_size: 2}
    schedule:
      - {name: class, at: "0 10 * * 1-5", duration: 2h, instances: 3}
    i_understand_this_spends_money: true

- name: Drain and delete it
  calque.gpu.pool_group:
    pool: lab-a/embedder
    state: absent
    i_understand_this_terminates_instances: true
"""

RETURN = r"""
pool:
  description: The pool's name.
  returned: always
  type: str
  sample: lab-a/embedder
group:
  description: The Auto Scaling group's name.
  returned: always
  type: str
  sample: calque-lab-a-embedder-1a2b3c4d
template:
  description: The launch template's name.
  returned: always
  type: str
  sample: calque-lab-a-embedder-1a2b3c4d
template_version:
  description: The template version the group launches from; null when none exists.
  returned: always
  type: int
config:
  description: Digest of what new instances are bootstrapped with (their C(calque:config) tag).
  returned: always
  type: str
min_size:
  description: The group's minimum size.
  returned: always
  type: int
max_size:
  description: The group's maximum size.
  returned: always
  type: int
desired:
  description: The group's desired count.
  returned: always
  type: int
instances:
  description: Instance ids in the group.
  returned: always
  type: list
  elements: str
replaced:
  description: Unhealthy instances this run replaced.
  returned: always
  type: list
  elements: str
rolling:
  description: Instances launched from an older config, replaced by the instance refresh.
  returned: always
  type: list
  elements: str
refresh_id:
  description: The instance refresh rolling the group, when one was started or is running.
  returned: always
  type: str
spend:
  description: The spend gate's arithmetic.
  returned: always
  type: str
  sample: 4 x g6.xlarge at $0.8048/h = $3.22/h <= max_hourly_usd $10.00/h
"""

from ansible_collections.amazon.aws.plugins.module_utils.modules import AnsibleAWSModule
from ansible_collections.calque.gpu.plugins.module_utils._launch import LAUNCH_MUTUALLY_EXCLUSIVE, LAUNCH_OPTIONS
from ansible_collections.calque.gpu.plugins.module_utils._ops import run_op


def main():
    argument_spec = dict(
        pool=dict(type="str", required=True),
        state=dict(type="str", choices=["present", "absent"], default="present"),
        count=dict(type="int"),
        min_size=dict(type="int", default=0),
        max_size=dict(type="int"),
        instance_types=dict(type="list", elements="str"),
        subnets=dict(type="list", elements="str", default=[]),
        market=dict(type="str", choices=["spot", "on-demand"], default="spot"),
        on_demand_base=dict(type="int", default=0),
        user_data=dict(type="str"),
        ttl=dict(type="str", default="3h"),
        tags=dict(type="dict", default={}),
        min_healthy_percentage=dict(type="int", default=90),
        instance_warmup=dict(type="int", default=300),
        max_hourly_usd=dict(type="float"),
        lab_budget=dict(
            type="dict",
            options=dict(
                gpu_hours=dict(type="float"),
                usd=dict(type="float"),
                notify_at=dict(type="float", default=0.8),
                raised_by=dict(type="str", default="your institution's GPU administrators"),
            ),
        ),
        lab_spent_elsewhere=dict(
            type="float", default=0.0, removed_in_version="2.0.0", removed_from_collection="calque.gpu"
        ),
        bucket=dict(type="str"),
        prefix=dict(type="str", default="calque"),
        i_understand_this_spends_money=dict(type="bool", default=False),
        i_understand_this_terminates_instances=dict(type="bool", default=False),
        gate_only=dict(type="bool", default=False),
        wait_timeout=dict(type="int", default=600),
        warm=dict(
            type="dict",
            options=dict(
                state=dict(type="str", choices=["Stopped", "Hibernated", "Running"], default="Stopped"),
                min_size=dict(type="int", default=1),
                max_prepared=dict(type="int"),
                reuse_on_scale_in=dict(type="bool", default=True),
                ready_timeout=dict(type="int", default=1800),
            ),
        ),
        capacity_block=dict(type="str"),
        schedule=dict(
            type="list",
            elements="dict",
            default=[],
            options=dict(
                name=dict(type="str", required=True),
                at=dict(type="str", required=True),
                duration=dict(type="str", required=True),
                instances=dict(type="int", default=1),
                lead=dict(type="str", default="10m"),
                timezone=dict(type="str", default="UTC"),
            ),
        ),
    )
    argument_spec.update(LAUNCH_OPTIONS)
    run_op(AnsibleAWSModule, "pool_group", argument_spec, mutually_exclusive=LAUNCH_MUTUALLY_EXCLUSIVE)


if __name__ == "__main__":
    main()

#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, calque developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: mig
short_description: Lay out MIG slices on a host's GPUs declaratively, with the fewest changes
version_added: 0.1.0
description:
  - Brings the host's GPUs to a MIG layout given as a layout file (O(config) and O(select)) or inline
    (O(layout)), in the spirit of mig-parted's C(mig-configs).
  - Plans first, then applies the plan. Only GPUs whose layout differs are touched; on a GPU, instances
    the new layout still contains are kept at their placements, and the others are placed on the card's
    grid by a search (largest profiles first), so no working instance is destroyed needlessly.
  - A layout that cannot fit a card fails before anything changes, naming the profiles and counts valid
    on that card.
  - An instance is busy when processes run on it or a live session of the host's session daemon
    (asked at O(session_socket) with its C(list) operation) holds it. Busy instances are never destroyed
    unless O(force=true), which first ends those sessions (reason C(layout); their holders are told, and
    the daemon audits them and records their usage) and then stops those processes; both are listed in the
    plan. Without O(force), the change is refused before anything changes, naming the GPU, the instance,
    the holder and the session's end; check mode warns that the real run will be refused.
  - A host with no session service (no O(session_config), nothing at the socket) has no session to protect
    (the module says so when the plan destroys instances). A host whose session daemon is configured but does
    not answer (stopped or crashed) may hold sessions nobody can list, so a plan that destroys instances there is
    refused without O(force=true), naming C(calque-session.service) and how to start it.
  - A MIG mode change takes effect at a GPU reset. The reset runs only with O(allow_reset=true) and when
    nothing holds the GPU; persistence mode (C(nvidia-persistenced)) and the C(nvidia_drm) module hold
    it. Otherwise the module returns RV(reset_required=true) and a later run (after a reset or a
    reboot) finishes the layout. Where the platform cannot reset a GPU, RV(reboot_required) is true.
  - A pending reset or a needed reboot is not a failure (the module warns; calque never reboots a host, so
    follow it with M(ansible.builtin.reboot) when RV(reboot_required) is true). A reset that
    O(allow_reset=true) allowed but something holding the GPU prevented is a failure.
  - A thin face over the C(calque.ops.mig) operation; the C(calque gpu mig plan|apply) commands run
    the same operation and follow the same rule (exit 0 with a warning, or 1 for a prevented reset).
author: calque developers (@calque)
options:
  config:
    description:
      - "Path of a layout file on the managed host: C(version: 1) and C(mig-configs:), a mapping of named configs."
      - "NVIDIA mig-parted's own files (C(version: v1)) are read as they are, compute-instance keys such as C(1c.3g.20gb) included."
      - Mutually exclusive with O(layout).
    type: path
  select:
    description:
      - Name of the config in O(config) to apply; may be left out when the file has exactly one.
      - "Quote names YAML reads as booleans: V('off'), V('on') (unquoted, they reach the module as C(False)/C(True))."
    type: str
  layout:
    description:
      - An inline layout, the list one named config holds. Each entry has C(mig-enabled) (bool) and
        optionally C(devices) (V(all), an index or a list of indices), C(device-filter) (catalog card,
        NVML name or PCI id), C(mig-devices) (profile name to count) and C(compute-instances)
        (profile name to a list of compute-slice sizes that split each GPU instance of that profile).
      - Mutually exclusive with O(config).
    type: list
    elements: dict
  force:
    description:
      - Allow destroying busy instances; their sessions are ended (reason C(layout)) and their processes stopped first.
    type: bool
    default: false
  session_socket:
    description:
      - The session daemon's socket; default the one O(session_config) names, else C(CALQUE_SESSION_SOCKET) or
        C(/run/calque/session.sock).
    type: path
  session_config:
    description:
      - The session daemon's configuration file; default C(/etc/calque/session.yaml). Where it exists a daemon is
        expected on the host, and one that does not answer refuses a change that destroys instances (without O(force)).
    type: path
  allow_reset:
    description:
      - Reset GPUs whose MIG mode must change, when nothing holds them.
    type: bool
    default: false
  drain:
    description:
      - Drain the GPUs whose layout differs, and only those, through the host's session daemon before the change
        (no new checkouts there, the refusal naming O(drain_reason)), and undrain them after.
      - A GPU someone had already drained stays drained. Needs root or the daemon's admin group.
    type: bool
    default: false
  drain_wait:
    description:
      - With O(drain), how many seconds live sessions on slices the layout destroys may take to run out by their own
        deadlines. A session that ends later is refused up front without O(force), and ended when the wait is over
        with it. Never ends a session on an unchanged GPU or instance.
    type: int
    default: 0
  drain_reason:
    description:
      - With O(drain), the reason a refused checkout is told.
    type: str
    default: MIG layout change
  window:
    description:
      - "UTC times a change may run, e.g. V(Sat,Sun 02:00-06:00), V(Mon-Fri 22:00-06:00), V(daily 03:00-04:00)."
      - Outside all of them a plan that changes something is refused before anything changes (check mode says so);
        one that changes nothing succeeds. Empty, the default, is any time.
    type: list
    elements: str
    default: []
extends_documentation_fragment:
  - calque.gpu.gpu_backend
  - calque.gpu.runtime
  - calque.gpu.attributes
attributes:
  check_mode:
    support: full
    details: Computes the plan and returns it with the MIG devices as they are; nothing is changed.
  diff_mode:
    support: full
    details: Shows each selected GPU's MIG mode and instances (profile@start) before and after.
  idempotent:
    support: full
    details: A second run with the same layout plans no operation and reports RV(ignore:changed=false).
"""

EXAMPLES = r"""
- name: Seven 1g slices on every A100
  calque.gpu.mig:
    layout:
      - devices: all
        device-filter: A100-40GB
        mig-enabled: true
        mig-devices:
          1g.5gb: 7
    allow_reset: true

- name: Apply a named config from a layout file
  calque.gpu.mig:
    config: /etc/calque/mig-layouts.yaml
    select: balanced

- name: Mixed layout on GPU 3 only; stop processes on instances that must go
  calque.gpu.mig:
    layout:
      - devices: [3]
        mig-enabled: true
        mig-devices: {3g.40gb: 1, 1g.10gb: 4}
        compute-instances: {3g.40gb: [1, 2]}
    force: true

- name: Change GPU 0 on a weekend night only, draining it first and letting its sessions run out for up to 2 h
  calque.gpu.mig:
    layout:
      - devices: [0]
        mig-enabled: true
        mig-devices: {7g.80gb: 1}
    drain: true
    drain_wait: 7200
    window: ["Sat,Sun 01:00-05:00"]
"""

RETURN = r"""
mig_devices:
  description: The MIG devices after the run (as they are, in check mode).
  returned: always
  type: list
  elements: dict
  sample:
    - gpu_index: 0
      profile: 3g.20gb
      profile_id: 9
      placement_start: 4
      placement_size: 4
      gi_id: 2
      ci_id: 0
      ci_profile: null
      uuid: MIG-8a1f7a4e-3c2b-5d6e-9f00-112233445566
reset_required:
  description: A MIG mode change waits for a GPU reset (rerun with O(allow_reset=true), or reboot).
  returned: always
  type: bool
reboot_required:
  description: The platform cannot reset the GPU; reboot the host, then run again.
  returned: always
  type: bool
plan:
  description: The operations planned, one sentence each.
  returned: always
  type: list
  elements: str
  sample: ["GPU 0: destroy 1g.5gb at 4 (GI 11)", "GPU 0: create 3g.20gb at 4 with CIs 3c"]
stopped_processes:
  description: With O(force=true), the busy instances destroyed, each with its processes and sessions.
  returned: always
  type: list
  elements: dict
ended_sessions:
  description: With O(force=true), the sessions ended (reason C(layout)) before their devices were destroyed.
  returned: always
  type: list
  elements: dict
refusal:
  description: >-
    In check mode, why the real run will be refused (busy instances without O(force), sessions that outlive
    O(drain_wait), outside O(window)); null otherwise.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.calque.gpu.plugins.module_utils._gpu import GPU_BACKEND_ARGS
from ansible_collections.calque.gpu.plugins.module_utils._ops import run_op


def main():
    argument_spec = dict(
        config=dict(type="path"),
        select=dict(type="str"),
        layout=dict(type="list", elements="dict"),
        force=dict(type="bool", default=False),
        allow_reset=dict(type="bool", default=False),
        session_socket=dict(type="path"),
        session_config=dict(type="path"),
        drain=dict(type="bool", default=False),
        drain_wait=dict(type="int", default=0),
        drain_reason=dict(type="str", default="MIG layout change"),
        window=dict(type="list", elements="str", default=[]),
    )
    argument_spec.update(GPU_BACKEND_ARGS)
    run_op(
        AnsibleModule,
        "mig",
        argument_spec,
        mutually_exclusive=[("config", "layout")],
        required_one_of=[("config", "layout")],
    )


if __name__ == "__main__":
    main()

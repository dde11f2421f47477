#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, calque developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: mps
short_description: Run MPS control daemons with default client limits on a host's GPUs
version_added: 0.1.0
description:
  - Starts or stops one CUDA MPS control daemon per GPU (or per MIG device with O(per_mig=true)), each
    with its own C(CUDA_MPS_PIPE_DIRECTORY) and C(CUDA_MPS_LOG_DIRECTORY) under O(pipe_root) and
    O(log_root).
  - Starting puts the GPU in EXCLUSIVE_PROCESS compute mode and sends the default active thread
    percentage and pinned device memory limit to the daemon; stopping quits the daemon and restores
    DEFAULT compute mode.
  - MPS gives no isolation between clients. The module refuses to run unless
    O(i_understand_shared_gpu_has_no_isolation=true).
  - Clients of different Unix users are serialised by the control daemon (one user's MPS server at a
    time); RV(user_model) says what the installed driver does and how slots must be given out.
  - A thin face over the C(calque.ops.mps) operation; C(calque gpu mps start|stop) run the same operation.
author: calque developers (@calque)
options:
  state:
    description:
      - V(started) ensures a daemon runs for each target with the given limits; V(stopped) ensures none does.
    type: str
    choices: [started, stopped]
    default: started
  gpus:
    description:
      - GPU indices to manage; all GPUs when left out.
    type: list
    elements: int
  per_mig:
    description:
      - One daemon per MIG device of the selected GPUs instead of one per GPU.
    type: bool
    default: false
  active_thread_percentage:
    description:
      - Default share of the GPU's SMs a client may use, C(1..100).
    type: int
  pinned_memory_limit:
    description:
      - Default pinned device memory per client, for example V(8G) or V(512M).
    type: str
  pipe_root:
    description:
      - Directory holding one pipe directory per daemon.
    type: path
    default: /run/calque/mps
  log_root:
    description:
      - Directory holding one log directory per daemon.
    type: path
    default: /var/log/calque/mps
  i_understand_shared_gpu_has_no_isolation:
    description:
      - Must be V(true) for the module to run, because MPS tenants share GPU memory and faults with no isolation.
    type: bool
    default: false
extends_documentation_fragment:
  - calque.gpu.gpu_backend
  - calque.gpu.runtime
  - calque.gpu.attributes
attributes:
  check_mode:
    support: full
    details: Lists the actions (compute mode, daemon start or quit, limit commands) without taking them.
  diff_mode:
    support: full
    details: Shows each daemon's state and limits before and after.
  idempotent:
    support: full
    details: A running daemon whose limits match is left alone; a second run reports RV(ignore:changed=false).
"""

EXAMPLES = r"""
- name: One MPS daemon per L4, each client limited to a quarter of the SMs and 5 GiB pinned
  calque.gpu.mps:
    state: started
    active_thread_percentage: 25
    pinned_memory_limit: 5G
    i_understand_shared_gpu_has_no_isolation: true

- name: Stop the daemons on GPUs 0 and 1
  calque.gpu.mps:
    state: stopped
    gpus: [0, 1]
    i_understand_shared_gpu_has_no_isolation: true
"""

RETURN = r"""
daemons:
  description: Every managed daemon after the run (as it is, in check mode).
  returned: always
  type: list
  elements: dict
  sample:
    - target: gpu0
      gpu_index: 0
      device_uuid: GPU-5b0c1d7e-0000-0000-0000-000000000000
      pipe_dir: /run/calque/mps/gpu0
      log_dir: /var/log/calque/mps/gpu0
      running: true
      servers: []
      active_thread_percentage: 25
      pinned_memory_limit: 5G
      compute_mode: EXCLUSIVE_PROCESS
actions:
  description: What was done (or, in check mode, would be done), one sentence each.
  returned: always
  type: list
  elements: str
user_model:
  description: Whether clients of different users are serialised, and the slot policy that follows.
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.calque.gpu.plugins.module_utils._gpu import GPU_BACKEND_ARGS
from ansible_collections.calque.gpu.plugins.module_utils._ops import run_op


def main():
    argument_spec = dict(
        state=dict(type="str", choices=["started", "stopped"], default="started"),
        gpus=dict(type="list", elements="int"),
        per_mig=dict(type="bool", default=False),
        active_thread_percentage=dict(type="int"),
        pinned_memory_limit=dict(type="str"),
        pipe_root=dict(type="path", default="/run/calque/mps"),
        log_root=dict(type="path", default="/var/log/calque/mps"),
        i_understand_shared_gpu_has_no_isolation=dict(type="bool", default=False),
    )
    argument_spec.update(GPU_BACKEND_ARGS)
    run_op(AnsibleModule, "mps", argument_spec)


if __name__ == "__main__":
    main()

#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, calque developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: gpu_info
short_description: Facts about a host's GPUs, MIG devices, processes and MPS daemons
version_added: 0.1.0
description:
  - Returns every GPU (index, name, UUID, memory, MIG mode current and pending, compute mode), its GPU
    and compute instances, its MIG devices with their UUIDs, the processes on each device, the MPS
    control daemons, and the card's entry in calque's catalog.
  - Read-only. A thin face over the C(calque.ops.gpu_info) operation (C(calque.gpu.facts.gather)); C(calque gpu info) reads the same facts.
author: calque developers (@calque)
options:
  pipe_root:
    description:
      - Directory holding the MPS daemons' pipe directories.
    type: path
    default: /run/calque/mps
  log_root:
    description:
      - Directory holding the MPS daemons' log directories.
    type: path
    default: /var/log/calque/mps
extends_documentation_fragment:
  - calque.gpu.gpu_backend
  - calque.gpu.runtime
  - calque.gpu.attributes
  - calque.gpu.attributes.changes_nothing
attributes:
  check_mode:
    support: full
    details: Reads only; the same in check mode.
"""

EXAMPLES = r"""
- name: Read the GPU facts
  calque.gpu.gpu_info:
  register: gpus

- name: Show the MIG device UUIDs
  ansible.builtin.debug:
    msg: "{{ gpus.gpus | map(attribute='mig_devices') | flatten | map(attribute='uuid') }}"
"""

RETURN = r"""
driver_version:
  description: The NVIDIA driver version (the simulator's, on a simulated host).
  returned: always
  type: str
  sample: 595.91.07
backend:
  description: The backend that answered (C(NvmlBackend) or C(SimGpu)).
  returned: always
  type: str
gpus:
  description: One entry per GPU with C(gpu), C(gpu_instances), C(mig_devices), C(processes) and C(catalog).
  returned: always
  type: list
  elements: dict
mps:
  description: The MPS daemons and the user model; null when the MPS control program is not installed.
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.calque.gpu.plugins.module_utils._gpu import GPU_BACKEND_ARGS
from ansible_collections.calque.gpu.plugins.module_utils._ops import run_op


def main():
    argument_spec = dict(
        pipe_root=dict(type="path", default="/run/calque/mps"),
        log_root=dict(type="path", default="/var/log/calque/mps"),
    )
    argument_spec.update(GPU_BACKEND_ARGS)
    run_op(AnsibleModule, "gpu_info", argument_spec)


if __name__ == "__main__":
    main()

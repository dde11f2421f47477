# -*- coding: utf-8 -*-
# Copyright: (c) 2026, calque developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    # The options every GPU module takes to pick its backend (module_utils/_gpu.py GPU_BACKEND_ARGS).
    DOCUMENTATION = r"""
options:
  gpu_backend:
    description:
      - Which GPU backend to use, in the words the C(calque) CLI (C(--gpu-backend)) and the session
        configuration (C(gpu_backend)) use too.
      - V(host) follows the host configuration (O(host_config)); V(nvml) uses the NVIDIA driver;
        V(sim) uses a simulated host (O(sim_state), else the host configuration's C(gpu.sim)).
    type: str
    choices: [host, nvml, sim]
    default: host
  host_config:
    description:
      - Host configuration file read by O(gpu_backend=host) (C(gpu.backend) V(nvml) or V(sim));
        defaults to E(CALQUE_HOST_CONFIG) or C(/etc/calque/host.yaml), and to NVML without a file.
    type: path
  sim_state:
    description:
      - State file of a simulated GPU host (tests and the sandbox); given alone, it means O(gpu_backend=sim).
    type: path
"""

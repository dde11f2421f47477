# -*- coding: utf-8 -*-
# Copyright: (c) 2026, calque developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    # The options every GPU module takes to pick its backend (module_utils/_gpu.py GPU_BACKEND_ARGS).
    DOCUMENTATION = r"""
options:
  host_config:
    description:
      - Host configuration file that selects the GPU backend (C(gpu.backend) V(nvml) or V(sim));
        defaults to E(CALQUE_HOST_CONFIG) or C(/etc/calque/host.yaml), and to NVML without a file.
    type: path
  sim_state:
    description:
      - State file of a simulated GPU host; when given, the module uses the simulator instead of NVML (tests and the sandbox).
    type: path
"""

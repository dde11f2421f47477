# -*- coding: utf-8 -*-
# Copyright: (c) 2026, calque developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Private to the calque.gpu collection: the options every GPU module takes to pick its backend."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

# Documented once, in doc_fragments/gpu_backend.py, in the words of calque.gpu.selection (which the CLI
# and the session configuration use too); the runtime's calque.ops.gpu_host.GpuHostRequest has the same
# fields and opens the backend they select.
GPU_BACKEND_ARGS = dict(
    gpu_backend=dict(type="str", choices=["host", "nvml", "sim"], default="host"),
    host_config=dict(type="path"),
    sim_state=dict(type="path"),
)

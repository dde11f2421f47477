# -*- coding: utf-8 -*-
# Copyright: (c) 2026, calque developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Private to the calque.gpu collection: the GPU modules' shared options and backend selection."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

# Options every GPU module takes (documented once, in doc_fragments/gpu_backend.py; the runtime's
# calque.ops.gpu_host.GpuHostRequest has the same fields).
GPU_BACKEND_ARGS = dict(
    host_config=dict(type="path"),
    sim_state=dict(type="path"),
)


def gpu_backend(module):
    """The backend the module's options select: the simulator at O(sim_state), else the host config."""
    from calque.ops.gpu_host import GpuHostRequest

    return GpuHostRequest(host_config=module.params.get("host_config"), sim_state=module.params.get("sim_state")).backend()


def dump(model):
    """A pydantic model as plain data for exit_json."""
    return model.model_dump(mode="json")

# -*- coding: utf-8 -*-
# Copyright: (c) 2026, calque developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Private to the calque.gpu collection: the GPU modules' shared options and backend selection."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

# Options every GPU module takes (documented once, in doc_fragments/gpu_backend.py).
GPU_BACKEND_ARGS = dict(
    host_config=dict(type="path"),
    sim_state=dict(type="path"),
)


def gpu_backend(module):
    """The backend the module's options select: the simulator at O(sim_state), else the host config."""
    from calque.gpu.hostconfig import GpuHostConfig, SimHostConfig, load_gpu_config, open_backend

    if module.params.get("sim_state"):
        config = GpuHostConfig(backend="sim", sim=SimHostConfig(state=module.params["sim_state"]))
    else:
        config = load_gpu_config(module.params.get("host_config"))
    return open_backend(config)


def dump(model):
    """A pydantic model (or a list of them) as plain data for exit_json."""
    if isinstance(model, list):
        return [m.model_dump(mode="json") for m in model]
    return model.model_dump(mode="json")

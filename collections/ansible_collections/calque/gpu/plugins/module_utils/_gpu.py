# -*- coding: utf-8 -*-
# Copyright: (c) 2026, calque developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Private to the calque.gpu collection: the GPU modules' shared options and backend selection."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

# Options every GPU module takes (documented once, in doc_fragments/gpu_backend.py), in the words of
# calque.gpu.selection, which the CLI and the session configuration use too.
GPU_BACKEND_ARGS = dict(
    gpu_backend=dict(type="str", choices=["host", "nvml", "sim"], default="host"),
    host_config=dict(type="path"),
    sim_state=dict(type="path"),
)


def gpu_backend(module):
    """The backend the module's options select, through the runtime's one resolver."""
    from calque.gpu.selection import GpuSelection, open_gpu

    p = module.params
    return open_gpu(GpuSelection(p.get("gpu_backend") or "host", sim_state=p.get("sim_state"), host_config=p.get("host_config")))


def dump(model):
    """A pydantic model (or a list of them) as plain data for exit_json."""
    if isinstance(model, list):
        return [m.model_dump(mode="json") for m in model]
    return model.model_dump(mode="json")

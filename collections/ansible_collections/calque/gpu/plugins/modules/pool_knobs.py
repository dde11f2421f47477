#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, calque developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: pool_knobs
short_description: A calque pool's scaling defaults from its Modal script's autoscaler knobs, inventory over them
version_added: 0.1.0
description:
  - Reads the keyword arguments of the workload's C(@app.cls) or C(@app.function) decorator without running
    the script (C(calque.ops.pool_knobs)), and resolves the pool's scaling values, each with where it came from
    (inventory, the script's keyword, or calque's default).
  - C(min_containers) (older C(keep_warm)) becomes the group's C(min_size), C(max_containers) (older
    C(concurrency_limit)) its C(max_size), C(buffer_containers) the scaling's C(buffer) (instances kept idle
    beyond the backlog's need while the pool is active), C(scaledown_window) (older C(container_idle_timeout))
    the scaling's C(idle_s) (the idle alarm's period, at least 60 s). One container is one worker process;
    counts are divided by O(workers) per instance, rounded up.
  - Changes nothing; with C(--diff) it shows each value and its source.
author: calque developers (@calque)
options:
  script:
    description: The workload script on the controller, optionally C(::Target) (the class or function served).
    type: str
    required: true
  workers:
    description: Worker processes per instance (the spec's C(workers)).
    type: int
    default: 1
  min_size:
    description: C(calque_pool_group.min_size) when inventory sets it (it overrides the script).
    type: int
  max_size:
    description: C(calque_pool_group.max_size) when inventory sets it.
    type: int
  count:
    description: C(calque_pool_group.count) when inventory sets it (the maximum when neither sets one).
    type: int
  buffer:
    description: C(calque_pool_scaling.buffer) when inventory sets it.
    type: int
  idle_s:
    description: C(calque_pool_scaling.idle_s) when inventory sets it.
    type: int
extends_documentation_fragment:
  - calque.gpu.runtime
  - calque.gpu.attributes
attributes:
  check_mode:
    support: full
    details: Reads the script; the same result in check mode.
  diff_mode:
    support: full
    details: Before is what inventory sets; after is each resolved value with its source.
  idempotent:
    support: full
    details: Never changes anything (RV(ignore:changed=false)).
"""

EXAMPLES = r"""
- name: Scaling defaults of the lab's script, inventory over them
  calque.gpu.pool_knobs:
    script: examples/embedder.py::Embedder
    workers: 1
    max_size: 4
  register: knobs
"""

RETURN = r"""
min_size:
  description: The group's minimum and its source.
  returned: always
  type: dict
  sample: {value: 1, source: "script: min_containers=1 on Embedder"}
max_size:
  description: The group's maximum and its source (value null when nothing sets one).
  returned: always
  type: dict
buffer:
  description: Instances kept beyond the backlog's need while active, and the source.
  returned: always
  type: dict
idle_s:
  description: Seconds idle before the group scales in (the idle alarm), and the source.
  returned: always
  type: dict
workers:
  description: Worker processes per instance the counts were divided by.
  returned: always
  type: int
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.calque.gpu.plugins.module_utils._ops import run_op


def main():
    argument_spec = dict(
        script=dict(type="str", required=True),
        workers=dict(type="int", default=1),
        min_size=dict(type="int"),
        max_size=dict(type="int"),
        count=dict(type="int"),
        buffer=dict(type="int"),
        idle_s=dict(type="int"),
    )
    run_op(AnsibleModule, "pool_knobs", argument_spec)


if __name__ == "__main__":
    main()

#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, calque developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: pool_spec
short_description: A warm pool's spec file, the calque runtime staged for its instances, and their user-data
version_added: 0.1.0
description:
  - Validates O(spec) as a calque C(PoolSpec) (the file every worker of the pool reads), writes it to
    O(path) when its text differs (mode C(0600)), and renders the EC2 user-data that turns an instance
    into a worker of the pool (installs the runtime, writes the spec to C(/etc/calque/pool.yml), starts
    C(calque pool worker) under systemd).
  - The instances install calque from, in order, O(runtime_pip), an already staged wheel
    (O(runtime_url) and O(runtime_sha256)), or, with O(stage_runtime=true), the wheel of the
    controller's calque staged now in the spec's bucket under C(<prefix>/runtime/) and presigned for
    O(runtime_ttl). An identical wheel is not uploaded again.
  - A thin face over the C(calque.ops.pool_spec) operation; C(calque pool user-data) and
    C(calque pool stage-runtime) run the same operations.
author: calque developers (@calque)
options:
  spec:
    description:
      - The C(PoolSpec) fields, for example C(model), C(workload) (an C(s3://) URI of the staged script,
        optionally C(::Class)), C(bucket), C(prefix), C(region), C(queue), C(method), C(workers).
      - Unknown fields and out-of-range values fail, naming the field.
    type: dict
    required: true
  path:
    description:
      - Where the controller keeps the spec file; its directory is created with mode C(0700). Left out, no
        file is written.
    type: path
  stage_runtime:
    description:
      - Stage the controller's calque wheel in the spec's bucket for the instances, unless O(runtime_pip)
        or O(runtime_url) says where the runtime comes from.
    type: bool
    default: true
  runtime_ttl:
    description:
      - How long the instances may download the staged wheel (their TTL), in seconds or as V(90m), V(3h),
        V(1d); at most 7 days.
    type: str
    default: 3h
  runtime_wheel:
    description:
      - Stage this built calque wheel instead of building the controller's.
    type: path
  runtime_wheelhouse:
    description:
      - Stage the pinned wheelhouse (the wheel's dependencies at the versions calque was tested with)
        beside the wheel, so the instances install with no package index.
    type: bool
    default: true
  runtime_wheelhouse_dir:
    description:
      - Stage this built wheelhouse (C(calque runtime wheelhouse DIR)) instead of building one.
    type: path
  runtime_pip:
    description:
      - A pip requirement or URL that installs calque on the instances; overrides any staged wheel.
    type: str
  runtime_url:
    description:
      - URL of a calque wheel staged earlier; needs O(runtime_sha256).
    type: str
  runtime_sha256:
    description:
      - The sha256 of the wheel at O(runtime_url), checked on the instance.
    type: str
  wheelhouse_url:
    description:
      - URL of a wheelhouse staged earlier (calque and its pinned dependencies); needs O(wheelhouse_sha256).
    type: str
  wheelhouse_sha256:
    description:
      - The sha256 of the wheelhouse at O(wheelhouse_url), checked on the instance.
    type: str
notes:
  - The wheel is staged with the module's region, profile and O(endpoint_url), and the credentials of
    the standard AWS chain.
extends_documentation_fragment:
  - calque.gpu.runtime
  - calque.gpu.offline
  - calque.gpu.attributes
  - amazon.aws.common.modules
  - amazon.aws.region.modules
  - amazon.aws.boto3
attributes:
  check_mode:
    support: full
    details:
      - Writes and uploads nothing. It builds the wheel into a temporary directory (or reads O(runtime_wheel)),
        packs a reused O(runtime_wheelhouse_dir), and compares their sha256s with the staged ones, so it
        reports a change exactly when the real run uploads or writes.
      - The user-data rendered in check mode is the real run's, with its URLs signed locally (only the
        signatures differ), so the pool group's config digest in check mode is the real run's.
      - A wheelhouse to build is not downloaded in check mode; the staged one stands while the wheel is
        unchanged (its pins travel in the wheel). Around a new wheel its sha256 is null until the real run.
  diff_mode:
    support: full
    details: Shows the spec file's text and the staged wheel's sha256 before and after.
  idempotent:
    support: full
    details: An unchanged spec and an identical staged wheel report RV(ignore:changed=false).
"""

EXAMPLES = r"""
- name: Spec, staged runtime and user-data of a pool
  calque.gpu.pool_spec:
    spec:
      model: meta-llama/Llama-3.1-8B-Instruct
      workload: s3://lab-a-pools/calque/pools/calque-pool-meta-llama-llama-3-1-8b-instruct-1a2b3c4d/workload/llm.py::Llm
      bucket: lab-a-pools
      region: us-east-1
    path: /etc/calque/pools/llama.yml
    runtime_ttl: 8h
  register: pool_spec

- name: Hand the user-data to the cohort
  calque.gpu.ec2_cohort:
    name: llama-pool
    count: 2
    instance_types: [g6.xlarge]
    user_data: "{{ pool_spec.user_data }}"
    i_understand_this_spends_money: true
"""

RETURN = r"""
spec:
  description: The validated spec, every field with its value.
  returned: always
  type: dict
path:
  description: Where the spec file is kept (null when O(path) was not given).
  returned: always
  type: str
user_data:
  description: The EC2 user-data script that makes an instance a worker of the pool.
  returned: always
  type: str
runtime:
  description: The staged wheel; null when the runtime comes from O(runtime_pip) or O(runtime_url).
  returned: always
  type: dict
  contains:
    bucket:
      description: The bucket the wheel is staged in.
      type: str
    key:
      description: Its key, C(<prefix>/runtime/calque-<version>-py3-none-any.whl).
      type: str
    sha256:
      description: Its sha256 (in check mode, of the wheel the real run stages).
      type: str
    url:
      description: Presigned GET URL valid for O(runtime_ttl) (check mode signs one too).
      type: str
    uploaded:
      description: Whether this run uploaded it.
      type: bool
"""

from ansible_collections.amazon.aws.plugins.module_utils.modules import AnsibleAWSModule
from ansible_collections.calque.gpu.plugins.module_utils._ops import run_op


def main():
    argument_spec = dict(
        spec=dict(type="dict", required=True),
        path=dict(type="path"),
        stage_runtime=dict(type="bool", default=True),
        runtime_ttl=dict(type="str", default="3h"),
        runtime_wheel=dict(type="path"),
        runtime_wheelhouse=dict(type="bool", default=True),
        runtime_wheelhouse_dir=dict(type="path"),
        runtime_pip=dict(type="str"),
        runtime_url=dict(type="str"),
        runtime_sha256=dict(type="str"),
        wheelhouse_url=dict(type="str"),
        wheelhouse_sha256=dict(type="str"),
    )
    together = [("runtime_url", "runtime_sha256"), ("wheelhouse_url", "wheelhouse_sha256")]
    run_op(AnsibleAWSModule, "pool_spec", argument_spec, required_together=together)


if __name__ == "__main__":
    main()

# -*- coding: utf-8 -*-
# Copyright: (c) 2026, calque developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

"""Private to the calque.gpu collection: the launch options' argument spec, declared once.

What an instance is launched from, shared by ``calque.gpu.pool_group`` and ``calque.gpu.ec2_cohort``:
the argument spec piece beside the ``calque.gpu.launch`` doc fragment, both read by
``calque.aws.acquire.launch_spec`` in the runtime. A module merges ``LAUNCH_OPTIONS`` into its spec
and passes ``LAUNCH_MUTUALLY_EXCLUSIVE`` on.
"""

from __future__ import annotations

LAUNCH_OPTIONS = dict(
    ami=dict(type="str"),
    ami_ssm_parameter=dict(type="str"),
    root_volume=dict(
        type="dict",
        default={},
        options=dict(
            size_gib=dict(type="int", default=100),
            type=dict(type="str", choices=["gp3", "gp2", "io1", "io2"], default="gp3"),
            kms_key_id=dict(type="str"),
        ),
    ),
    instance_profile=dict(type="str"),
    security_groups=dict(type="list", elements="str", default=[]),
    key_name=dict(type="str", no_log=False),
)

LAUNCH_MUTUALLY_EXCLUSIVE = [("ami", "ami_ssm_parameter")]

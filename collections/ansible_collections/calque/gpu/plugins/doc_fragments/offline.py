# -*- coding: utf-8 -*-
# Copyright: (c) 2026, calque developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    # What every calque module that calls AWS does under CALQUE_OFFLINE=1 (calque.aws.clients).
    DOCUMENTATION = r"""
options: {}
notes:
  - With the environment variable E(CALQUE_OFFLINE=1) the module refuses any endpoint that is not
    loopback, so offline runs (the sandbox, the tests) can never reach a real AWS account.
"""

# -*- coding: utf-8 -*-
# Copyright: (c) 2026, calque developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    # What check_mode, diff_mode and idempotent mean for a calque module; each module states its own
    # support level and details under attributes:.
    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    description:
      - Computes the plan (what differs from the requested state) and reports it without applying it;
        the real run applies exactly that plan.
  diff_mode:
    description:
      - Returns the before and after of what the user asked for (a queue's attributes, a GPU's layout),
        not of internal state.
  idempotent:
    description:
      - A second run with the same options changes nothing and reports RV(ignore:changed=false).
"""

    # A module that changes nothing (it reads or renders); each states its own check_mode details.
    CHANGES_NOTHING = r"""
options: {}
attributes:
  diff_mode:
    support: none
    details: Nothing changes, so there is nothing to compare.
  idempotent:
    support: full
    details: Never changes anything.
"""

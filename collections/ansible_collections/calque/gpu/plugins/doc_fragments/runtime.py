# -*- coding: utf-8 -*-
# Copyright: (c) 2026, calque developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    # Every calque.gpu module is a thin face over the calque runtime, which must be importable by the
    # Python that runs the module (the controller for AWS modules, the GPU host for GPU modules).
    DOCUMENTATION = r"""
options: {}
requirements:
  - python >= 3.10
  - calque (the runtime Python package, same version as this collection)
notes:
  - The module only parses its options and calls the C(calque) runtime; the same code path serves
    the C(calque) command line, so a behaviour is defined and tested once.
"""

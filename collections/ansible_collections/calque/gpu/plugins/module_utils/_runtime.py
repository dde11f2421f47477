# -*- coding: utf-8 -*-
# Copyright: (c) 2026, calque developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

"""Private to the calque.gpu collection: the guarded import of the ``calque`` runtime.

Modules are thin faces over the runtime; they import it through here so that a host without it
gets one clear message (install the ``calque`` Python package) instead of a traceback.
"""

from __future__ import annotations

import traceback

try:
    import calque

    HAS_CALQUE = True
    CALQUE_VERSION = calque.__version__
    CALQUE_IMPORT_ERROR = None
except ImportError:
    HAS_CALQUE = False
    CALQUE_VERSION = None
    CALQUE_IMPORT_ERROR = traceback.format_exc()


def require_calque(module):
    """Fail the module with what to install when the runtime is missing."""
    if not HAS_CALQUE:
        from ansible.module_utils.basic import missing_required_lib

        module.fail_json(
            msg=missing_required_lib(
                "calque",
                url="install it with the calque.gpu.runtime role and run GPU modules with "
                "ansible_python_interpreter set to its venv's python (default /opt/calque/venv/bin/python)",
            ),
            exception=CALQUE_IMPORT_ERROR,
        )

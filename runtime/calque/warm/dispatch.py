"""The one piece of state the stand-in ``modal`` module and its calls share: who serves ``.remote``.

Set only by ``calque run`` on the submitter (``calque.run.script``): the object that turns the
script's classes and functions into proxies whose ``.remote``/``.map``/``.spawn`` reach a pool.
None in a worker process, where the decorators return the script's own classes and functions.
Its own module so that ``modal_shim`` and ``calls`` both read it without importing each other.
"""

from __future__ import annotations

from typing import Any


class ShimError(Exception):
    """A construct the calque worker cannot honour (raised at load, or when an inert value is used)."""


class _Dispatch:
    client: Any = None


DISPATCH = _Dispatch()

"""Layer 0: acquire, resize and release cohorts of EC2 instances. ``Acquirer`` is the entry point.

- ``acquirer``: plan / apply / release / status over a ``CohortSpec``
- ``sweep``: the parallel capacity sweep over (market, type, subnet)
- ``quota``: the Service Quotas vCPU preflight
- ``launch_spec``: the hardened RunInstances request, tags and TTL user-data
- ``gate``: consent flags and the spend ceiling
- ``cohort``: describe and tag-scoped terminate

The names below load on first use: ``calque pool status`` imports ``scaling`` from this package and
should not pay for the acquirer (pricing, the sweep, YAML, the cohort models).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from calque.lazyload import lazy_names

if TYPE_CHECKING:
    from calque.aws.acquire.acquirer import Acquirer
    from calque.aws.acquire.spend_gate import Consent
    from calque.models.acquire import CohortPlan, CohortResult, CohortSpec

_HOME = {
    "Acquirer": "calque.aws.acquire.acquirer",
    "Consent": "calque.aws.acquire.spend_gate",
    "CohortPlan": "calque.models.acquire",
    "CohortResult": "calque.models.acquire",
    "CohortSpec": "calque.models.acquire",
}


__getattr__ = lazy_names(__name__, _HOME, globals())


__all__ = ["Acquirer", "CohortPlan", "CohortResult", "CohortSpec", "Consent"]

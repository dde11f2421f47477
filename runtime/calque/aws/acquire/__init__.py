"""Layer 0: acquire, resize and release cohorts of EC2 instances. ``Acquirer`` is the entry point.

- ``acquirer``: plan / apply / release / status over a ``CohortSpec``
- ``sweep``: the parallel capacity sweep over (market, type, subnet)
- ``quota``: the Service Quotas vCPU preflight
- ``launch_spec``: the hardened RunInstances request, tags and TTL user-data
- ``gate``: consent flags and the spend ceiling
- ``cohort``: describe and tag-scoped terminate
"""

from calque.aws.acquire.acquirer import Acquirer
from calque.aws.acquire.gate import Consent
from calque.models.acquire import CohortPlan, CohortResult, CohortSpec

__all__ = ["Acquirer", "CohortPlan", "CohortResult", "CohortSpec", "Consent"]

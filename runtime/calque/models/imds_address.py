"""Where every EC2 instance's metadata service answers: the one spelling of its address.

The default of the pool spec's and the session-host spec's ``imds_endpoint`` and of
``calque session fleet --imds``; ``calque.aws.imds`` builds the one client of it. Standard library
only, so the CLI reads it without loading pydantic.
"""

from __future__ import annotations

IMDS_ENDPOINT = "http://169.254.169.254"  # link-local, the same on every instance

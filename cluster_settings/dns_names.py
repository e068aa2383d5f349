"""The DNS-1123 label pattern Kubernetes requires of node names. Its own module, free of
pydantic, because every provider's Check uses it and a provider process should not pay for
the settings models to check a name."""

from __future__ import annotations

import re

DNS_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

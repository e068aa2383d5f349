"""How a k3s release is named: `v<major>.<minor>.<patch>+k3s<n>`, as k3s's GitHub releases and
its install script name them. Kept here, at the bottom of the layers, so the settings' checks and
the upgrade's plan read versions the same way."""

from __future__ import annotations

import re

K3S_VERSION = re.compile(r"^v(\d+)\.(\d+)\.(\d+)\+k3s(\d+)$")

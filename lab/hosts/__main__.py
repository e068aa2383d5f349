"""``python -m lab.hosts``: see :mod:`lab.hosts.cli`."""

import sys

from lab.hosts.cli import main

sys.exit(main())

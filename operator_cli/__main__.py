"""`python -m operator_cli`: see operator_cli.cli."""

import sys

from operator_cli.cli import main

sys.exit(main())

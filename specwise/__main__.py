"""`python -m specwise`: the `specwise` command."""

import sys

from specwise.cli import main

sys.exit(main())

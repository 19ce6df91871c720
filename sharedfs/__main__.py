"""``python -m sharedfs``: the same as the ``sharedfs`` command."""

import sys

from .cli import main

sys.exit(main())

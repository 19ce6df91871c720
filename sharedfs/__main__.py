"""``python -m sharedfs``: the same as the ``sharedfs`` command."""

import sys

from sharedfs.commands.cli import main

sys.exit(main())

"""``python -m sharedfs.demo.hostilefs --profile P BACKING MOUNTPOINT``: serve in the foreground."""

import sys

from .server import main

sys.exit(main())

"""hostilefs's server, run by path: ``python .../hostilefs/hostilefs.py --profile P BACKING MOUNTPOINT``.

``sharedfs locks`` and the handover read a hostilefs mount's options from this file name on its command line.
"""

import importlib
import os
import sys

if __name__ == "__main__":
    # By path, never through sharedfs (a half-written sharedfs/__init__.py cannot break it): this folder
    # is imported as the top-level package `hostilefs`, whose modules import only each other and the stdlib.
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.exit(importlib.import_module("hostilefs.server").main())

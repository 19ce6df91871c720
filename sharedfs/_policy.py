"""Moved to :mod:`sharedfs.model.policy` in sharedfs 0.2; this alias goes in 0.3.

Plugins and shims import their names from :mod:`sharedfs.types` (docs/architecture.md).
"""

import sys
import warnings

from sharedfs.model.policy import __name__ as _new_name

warnings.warn(
    f"sharedfs._policy moved to {_new_name}"
    " (plugins import their names from sharedfs.types); the old path goes in sharedfs 0.3",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = sys.modules[_new_name]

"""Every environment variable sharedfs reads, in one place.

``DISABLE`` and ``TRUE_VALUES`` are defined in the bootstrap (the only code that
runs at interpreter start) and re-exported here.
"""

from ._bootstrap import DISABLE, TRUE_VALUES

__all__ = ["DISABLE", "TRUE_VALUES", "STRICT", "CONFIG", "LOCK", "CACHE", "CACHE_ROOT", "WAIT_TIMEOUT",
           "LEASE_SECONDS", "MAX_WORKERS", "LOG", "NODE_ID"]

#: ``1``: an internal error in a shim re-raises instead of being logged (CI uses it).
STRICT = "SHAREDFS_STRICT"
#: Path of a TOML policy file.
CONFIG = "SHAREDFS_CONFIG"
LOCK = "SHAREDFS_LOCK"
CACHE = "SHAREDFS_CACHE"
CACHE_ROOT = "SHAREDFS_CACHE_ROOT"
WAIT_TIMEOUT = "SHAREDFS_WAIT_TIMEOUT"
LEASE_SECONDS = "SHAREDFS_LEASE_SECONDS"
MAX_WORKERS = "SHAREDFS_MAX_WORKERS"
LOG = "SHAREDFS_LOG"
NODE_ID = "SHAREDFS_NODE_ID"

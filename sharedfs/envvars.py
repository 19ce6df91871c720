"""Every environment variable sharedfs reads, in one place.

Stdlib-free on purpose: the bootstrap imports this module at interpreter start.
"""

#: ``1``/``true``/``yes``/``all``: install nothing.  ``datasets,wids``: block those shims.
DISABLE = "SHAREDFS_DISABLE"
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

#: Values of ``SHAREDFS_DISABLE`` (and ``SHAREDFS_STRICT``) that mean "everything" / "on".
TRUE_VALUES = frozenset({"1", "true", "yes", "on", "all", "*"})

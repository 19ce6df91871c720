"""Every environment variable sharedfs reads, in one place (the OpenTelemetry habit)."""

__all__ = ["DISABLE", "TRUE_VALUES", "STRICT", "CONFIG", "LOCK", "CACHE", "CACHE_ROOT", "WAIT_TIMEOUT",
           "LEASE_SECONDS", "POLL_INTERVAL", "MAX_WORKERS", "LOG", "NODE_ID", "SHARED_GROUP"]

#: ``1``/``true``/``yes``/``all``: install nothing.  ``datasets,wids``: block those shims.
#: (The start-up bootstrap spells this name itself, to import nothing; a test keeps them equal.)
DISABLE = "SHAREDFS_DISABLE"
#: Values of ``SHAREDFS_DISABLE`` (and ``SHAREDFS_STRICT``) that mean "everything" / "on".
TRUE_VALUES = frozenset({"1", "true", "yes", "on", "all", "*"})
#: ``1``: an internal error in a shim re-raises instead of being logged (CI uses it).
STRICT = "SHAREDFS_STRICT"
#: Path of a TOML policy file.
CONFIG = "SHAREDFS_CONFIG"
LOCK = "SHAREDFS_LOCK"
CACHE = "SHAREDFS_CACHE"
CACHE_ROOT = "SHAREDFS_CACHE_ROOT"
WAIT_TIMEOUT = "SHAREDFS_WAIT_TIMEOUT"
LEASE_SECONDS = "SHAREDFS_LEASE_SECONDS"
#: Longest pause between a waiting node's looks at the shared filesystem (bounds metadata load).
POLL_INTERVAL = "SHAREDFS_POLL_INTERVAL"
MAX_WORKERS = "SHAREDFS_MAX_WORKERS"
LOG = "SHAREDFS_LOG"
NODE_ID = "SHAREDFS_NODE_ID"
#: Team caches: the group whose members share the caches sharedfs places and the files it creates.
SHARED_GROUP = "SHAREDFS_SHARED_GROUP"

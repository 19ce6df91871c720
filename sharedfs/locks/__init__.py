"""``sharedfs.lock(path)``: a lock that is correct for the filesystem ``path`` lives on.

The plugins choose the kind per path (``sharedfs_choose_lock``); this package
carries the choice out behind filelock's own contract:

* :mod:`~sharedfs.locks._api` -- the filelock-shaped class (:class:`SharedFSLock`,
  and :func:`drop_in` for a framework's own filelock subclass);
* :mod:`~sharedfs.locks._kinds` -- the four kinds (flock, posix, soft, lease), one
  non-blocking attempt each;
* :mod:`~sharedfs.locks._marker` -- the existence marker with its holder record,
  stale-holder breaking and lease renewal.

and, for shims and ``sharedfs locks`` (the other modules are the package's own):

* :mod:`~sharedfs.locks.stock` -- a framework's lock file held the way stock filelock
  holds it, beside sharedfs's own lock (torch's extension build lock);
* :mod:`~sharedfs.locks.names` -- the names of the files sharedfs puts beside a
  framework's lock, which ``sharedfs locks`` reads back;
* :mod:`~sharedfs.locks.reporting` -- when a waiter says whom it waits for.
"""

from sharedfs.errors import LockTimeout
from sharedfs.locks._api import SharedFSLock, SharedFSLockMixin, drop_in, lock
from sharedfs.locks._marker import marker_path

__all__ = ["LockTimeout", "SharedFSLock", "SharedFSLockMixin", "drop_in", "lock", "marker_path"]

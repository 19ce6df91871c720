"""A shard cache that many processes on many nodes fill, read and evict at once.

Used by the webdataset and wids shims (and usable directly).  What goes wrong
without it: webdataset 1.0's ``FileCache`` has no lock, so every worker of
every node downloads the same shard, into a temp name ``dest + ".temp{pid}"``
that collides across nodes; its ``LRUCleanup`` runs in every process and
deletes files others are about to open.  wids' ``ULockFile`` unlinks its lock
file on release, which splits waiters across inodes and, on NFS/FUSE, raises
``FileNotFoundError: ....tar.lock`` (webdataset#386); it downloads straight to
the final name, so a killed download leaves a truncated shard that later
readers trust.

Layout
------
The cache directory holds the shards and nothing else, exactly what the stock
framework puts there: its own listing and size accounting (webdataset's
``LRUCleanup``, wids' ``keep_most_recent_files``) must not count sharedfs.  The
coordination files live in a hidden sibling, on the same filesystem so that
every node sees them::

    <parent>/<cache>/                        the shards, named by the framework
    <parent>/.<cache>.sharedfs/              coordination; same group and mode as <cache>
        stripes/<NNN>                        lock stripes: a shard's lock is the stripe its name hashes
                                             to (1024 files at most, however many shards come and go)
        claims/<key>                         "downloading" / "published" HolderRecord, created O_EXCL
        inuse/<key>.<pid>.<rand>             HolderRecord of a reader that has the shard open or is opening it
        tmp/<key>.<rand>/                    one download in progress: mode 0700, private to its process
        evict.lock                           one evictor per cache at a time

Why a sibling: it is the nearest place outside the cache that is on the same
mount (checked: a cache that is itself a mount point -- a bind mount, a
container volume -- has its parent on another filesystem), so other nodes see
the claims and locks, and a finished download is renamed into the cache
atomically (where a quota realm or project quota boundary still makes that
rename fail with EXDEV, the shard is copied in under a hidden temp name, like
webdataset's own ``.temp`` files, and that is said once).  Stripes instead of a
lock file per shard: a per-shard lock file outlives its shard (unlinking it is
unsafe while others may wait on it: webdataset#386), so the directory grew by
one file per shard ever cached.  Two shards on one stripe serialise their
downloads, which with 16 downloads in flight delays about 1.5 % of them.  A
claim lives as long as its shard, a marker as long as its reader, a private
download directory as long as its download.

The sibling is not used -- the same tree goes to ``<cache>/.sharedfs/``, and
this is said once per cache -- when this process cannot create entries in the
parent, when the cache is a mount point, when the cache is reached through a
symlink someone else may have planted (:mod:`sharedfs.fs.trustedpath`: nothing
is created beside wherever it points, and the cache is no team cache), or when the parent is writable by
every user (``/tmp``) and the sibling is not owned by the cache's owner (anyone
could have created it first).  Every operation looks for a usable sibling first
and then for an existing ``<cache>/.sharedfs/``, so processes that chose
differently at the same first moment agree again at their next operation.

Removing the cache but keeping the sibling is harmless: a claim counts only
while its shard is visible, :func:`evict` removes claims of shards that are
gone, and a process that used a cache removes its sibling at exit if the cache
no longer exists (a cache in a ``TemporaryDirectory`` leaves nothing behind) -- only
the very tree it held open from first use (device and inode at that name), emptied
through descriptors of the names sharedfs makes there: a member who renamed one of
your directories to the sibling's name finds it intact.
A ``<cache>/.sharedfs/`` without ``stripes/`` was left by an earlier sharedfs
(a lock file per shard); it is ignored, and can be deleted once no job of that
version uses the cache -- processes of that version do not coordinate with
this layout.

Team caches
-----------
A cache in a directory a group shares (setgid and group-writable, a default ACL
for a group, or ``SHAREDFS_SHARED_GROUP``: see ``plugins/teamcache.py``) is filled
by several users, each with her own umask.  Under umask 022 the framework makes
the cache directory 2755 and the first user's coordination tree would copy that
mode, so the next member could neither publish a shard nor leave an in-use marker.
In a team cache every entry this module makes is the group's, whatever the umask:
the cache directory (if this user made it) and the coordination tree get the
group's bits (g+rwx, setgid) and group; records, and every published shard (made by
the framework's downloader, a Python ``open`` or ``curl``, in the private download
directory), get g+rw and the group through their descriptor before they are
renamed into place.  The private download directories stay 0700: they are what
keeps a member from swapping the file a downloader writes to.

Hostile neighbours
------------------
A cache shared by a group is group-writable, and so is its coordination tree:
any member can rename an entry or plant a symlink there.  So nothing here
follows a symlink or rewrites a file through a path: records are created
``O_EXCL|O_NOFOLLOW`` and changed only through the descriptor that created them,
read with :func:`sharedfs.fs.safefile.read_untrusted` (no symlinks, no FIFOs, a size
cap) and accepted only if they parse as a :class:`~sharedfs.model.records.HolderRecord`;
a download is written into a directory only its process can write, reached
through a descriptor (``/proc/<pid>/fd/<n>``) that nobody can swap.  Eviction
removes nothing by path: shards through the cache directory's descriptor, proven
to be the directory this process first used at that name (device, inode, owner;
a swapped cache skips the round with one line), and records through descriptors
of the tree's parts, each entered without following a symlink; a file goes only
while its name is still the file that was judged.

Guarantees: a shard is downloaded at most once per cache while its first
download succeeds (the claim makes this hold even where a new file stays
invisible to other nodes for a while, like NFS's negative lookup cache); a
shard is published by atomic rename after fsync, so a reader never sees a
partial one; the evictor deletes a shard only while holding its lock and while
no live reader has an in-use marker for it.  A marker that cannot be read
(garbled, foreign, a writer killed halfway) keeps its shard for
:data:`GARBLED_GRACE` seconds, not forever, and a marker that could not be
written completely (ENOSPC) is removed at once and the error says so.
Non-guarantee: a reader whose marker the evictor cannot see yet (lagging
metadata) may lose the race for a *closed* shard; it then finds the name
missing and fetches it again under the lock -- a second download, never a
missing or truncated file.

Where the code is
-----------------
:mod:`~sharedfs.shardcache.tree`
    where things live: shard keys and lock stripes, finding or creating the coordination tree
:mod:`~sharedfs.shardcache.claims`
    the records in it: download claims, in-use markers, and :func:`~sharedfs.shardcache.claims._alive`,
    the one rule for whether a record's writer may still use its shard
:mod:`~sharedfs.shardcache.downloads`
    one download: its private directory, its way into the cache (rename, or copy across a quota
    realm), and :func:`download_atomic`
:mod:`~sharedfs.shardcache.fetch`
    :func:`open_shard`, :func:`ensure` and :func:`shard_lock`: who downloads a shard, and when
:mod:`~sharedfs.shardcache.eviction`
    :func:`evict`, :func:`evictor`, :func:`try_evict` and the sweep of what dead processes left

The names below are the public ones.  A tunable (``STRIPES``, ``LAG_BOUND``)
is read in the module that defines it, so a test changes it there, not here.
"""

from __future__ import annotations

from sharedfs.shardcache.claims import GARBLED_GRACE, InUse, readers
from sharedfs.shardcache.downloads import Download, download_atomic
from sharedfs.shardcache.eviction import evict, evictor, try_evict
from sharedfs.shardcache.fetch import ensure, open_shard, shard_lock
from sharedfs.shardcache.tree import (
    KEY_PATTERN,
    META,
    NOT_SHARDS,
    SIBLING_SUFFIX,
    SUBDIRS,
    Layout,
    forget,
    key,
    layout,
    stripe,
)

__all__ = ["GARBLED_GRACE", "KEY_PATTERN", "META", "NOT_SHARDS", "SIBLING_SUFFIX", "SUBDIRS", "Download", "InUse",
           "Layout", "download_atomic", "ensure", "evict", "evictor", "forget", "key", "layout", "open_shard",
           "readers", "shard_lock", "stripe", "try_evict"]

"""What the next holder sees: a lock handed to another node waits out that node's client caches.

The guarantee, the rule and its costs: docs/api.md, "What the next holder sees"."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import stat
import threading
import time
from typing import NamedTuple

from sharedfs.fs.directory import Directory, identity
from sharedfs.fs.safefile import NOFOLLOW, read_untrusted
from sharedfs.locks._kinds import share
from sharedfs.model.fsinfo import FsInfo, Mount
from sharedfs.model.mounts import FuseClient, client_options, fuse_client
from sharedfs.model.policy import TeamCache

log = logging.getLogger("sharedfs")

LAST_SUFFIX = ".last"
WANT_SUFFIX = ".want"
#: Both records are this long, so an attribute cache holding a stale size still reads all of one.
RECORD_SIZE = 64
#: Longest cache timeout taken from a mount's options (a typo such as 3600 would stall every handover).
MAX_SETTLE = 60.0

#: JuiceFS's .config is ~3 KB; a cap keeps a hostile one from costing more.
CONFIG_CAP = 64 * 1024

_RECORD = re.compile(rb"sharedfs (last|want) node=([0-9a-f]{16})\n *")

#: sharedfs's own FUSE fake (``sharedfs.demo.hostilefs``): its ``lagging`` profile hides one node's new
#: entries from the others for ``--lag-ms``, as a negative-lookup cache would.
_HOSTILEFS = FuseClient("hostilefs", "fuse", ("fuse.hostilefs",), "node-local", "node-local", True, True,
                        daemons=("hostilefs.py",), caches=(("profile", None), ("lag-ms", "2000")))

_settles: dict[tuple[int, str], Settle] = {}
_guard = threading.Lock()
_said: set[str] = set()

#: What handovers cost this process (read by benchmarks and tests): cross-node waits and their seconds,
#: handovers that needed none, and acquisitions given back to another node's waiter.
stats = {"waits": 0, "waited": 0.0, "same_node": 0, "first": 0, "yields": 0}


class Yield(Exception):
    """A waiter on another node asked for a turn: this acquisition lets go and waits instead."""


#: Where a mount's handover wait comes from (:attr:`Settle.source`).
READ, DECLARED, ASSUMED, NONE = "read", "declared", "assumed", "none"


class Settle(NamedTuple):
    """A mount's handover wait in ``seconds``; ``source`` is one of :data:`READ` :data:`DECLARED`
    :data:`ASSUMED` :data:`NONE`, ``how`` says from where (read), or why it cannot be read (assumed)."""

    seconds: float
    source: str
    how: str


def settle_seconds(fs: FsInfo) -> float:
    """How long the next holder after another node's waits on the mount of ``fs`` (0: no wait, no rule)."""
    found = settle(fs)
    if found.source == ASSUMED:
        _say_once(fs.mount.mount_point, "locks on %s: %s", fs.mount.mount_point, settle_line(fs))
    return found.seconds


def settle(fs: FsInfo) -> Settle:
    """The longest metadata cache timeout of the mount of ``fs``: as its client runs with it where this user can
    read that; else as a site plugin declares it; else, where a client caches for a time nobody here can read,
    :data:`MAX_SETTLE` (cannot tell must not mean "no wait").  Cached per mount."""
    mount = fs.mount
    key = (mount.mount_id, mount.mount_point)
    found = _settles.get(key)
    if found is None:
        found = _settle(fs)
        found = found._replace(seconds=min(found.seconds, MAX_SETTLE))
        with _guard:
            _settles[key] = found
    return found


def _settle(fs: FsInfo) -> Settle:
    mount = fs.mount
    if mount.fstype == "fuse.hostilefs":
        seen = client_options(mount, _HOSTILEFS) or {}
        if "lagging" not in (seen.get("profile") or "").split("+"):
            return Settle(0.0, NONE, "hostilefs without its lagging profile caches nothing")
        return Settle(_seconds(seen.get("lag-ms") or "2000") / 1000, READ, "hostilefs's --lag-ms")
    client = fuse_client(mount)
    if client is not None and client.bucket:  # a bucket mount gets no lock at all (plugins/locking.py)
        return Settle(0.0, NONE, "a bucket mount takes no lock")
    read = _read(mount, client) if client is not None and client.caches else None
    if read is not None:
        return Settle(read[0], READ, read[1])
    if fs.cache_seconds is not None:
        return Settle(fs.cache_seconds, DECLARED, "a site plugin's FsInfo.cache_seconds")
    if client is None or not client.caches:
        return Settle(0.0, NONE, "sharedfs knows no metadata cache of its clients to wait out")
    return Settle(MAX_SETTLE, ASSUMED, _unreadable(client))


def _read(mount: Mount, client: FuseClient) -> tuple[float, str] | None:
    """The longest cache timeout ``client`` runs with on ``mount`` and where it was read; ``None``: cannot tell."""
    if client.kind == "juicefs":
        declared = _juicefs_config(mount)
        if declared is not None:
            return declared, "JuiceFS's .config"
    # Options the client runs with (its command line, MooseFS's .params); absent ones have their default.
    options = mount.client_options
    if options is None:
        return None
    longest = 0.0
    for name, default in client.caches:
        value = options.get(name) or default
        if value is None:  # not given, and no documented default: cannot tell
            return None
        longest = max(longest, _seconds(value))
    return longest, (f"{client.name}'s {client.params_file}" if client.params_file
                     else f"the command line of {client.name}'s client")


def _unreadable(client: FuseClient) -> str:
    if client.params_file:
        return f"{client.name}'s {client.params_file} is readable by root only"
    if not client.daemons:
        return f"{client.name} keeps them in its client's configuration file"
    if client.kind == "juicefs":
        return ("JuiceFS's .config is readable by root only, and its client's command line is not readable here "
                "(another PID namespace, /proc mounted hidepid, or a title cut at 255 bytes)")
    return f"{client.name}'s client process is not visible here (another PID namespace, or /proc mounted hidepid)"


def settle_line(fs: FsInfo) -> str:
    """One line for ``status`` and ``doctor``: how long a holder after another node's waits here, and why."""
    found = settle(fs)
    if found.source == NONE:
        return f"no wait after another node's holder: {found.how}"
    waits = f"a holder after another node's waits {found.seconds:g} s"
    if found.source == READ:
        return f"{waits}, the longest metadata cache timeout in {found.how}"
    if found.source == DECLARED:
        return f"{waits}, the longest metadata cache timeout declared by {found.how}"
    return (f"{waits}, ASSUMED (the longest it honours): {found.how}; declare the mount's longest cache timeout "
            "in a site plugin (FsInfo cache_seconds; docs/filesystems.md, \"Declaring a filesystem you know better\")")


#: The cache timeouts (nanoseconds) in the ``.config`` JuiceFS serves at its mount's root.
_JUICEFS_TIMEOUTS = ("AttrTimeout", "EntryTimeout", "DirEntryTimeout", "NegEntryTimeout")


def _juicefs_config(mount: Mount) -> float | None:
    """The longest cache timeout in JuiceFS's own ``.config`` (root-only, made by the client: nobody can plant
    it); ``None`` when it cannot be read.  Its process title is no substitute: JuiceFS rewrites it, cut short."""
    try:
        got = read_untrusted(os.path.join(mount.mount_point, ".config"), CONFIG_CAP)
    except OSError:
        return None
    if got is None or got[1].st_uid != 0:
        return None
    try:
        config = json.loads(got[0])
        return max(float(config[name]) for name in _JUICEFS_TIMEOUTS) / 1e9
    except (ValueError, KeyError, TypeError):
        return None


def _seconds(text: str) -> float:
    """``3``, ``3.000``, ``3s``, ``500ms`` -> seconds (0 for what is not a number)."""
    text = text.strip().lower()
    scale = 1.0
    if text.endswith("ms"):
        text, scale = text[:-2], 0.001
    elif text.endswith("s"):
        text = text[:-1]
    try:
        value = float(text) * scale
    except ValueError:
        return 0.0
    return value if value > 0 else 0.0


def _tag(node_id: str) -> bytes:
    return hashlib.sha256(node_id.encode("utf-8", "surrogateescape")).hexdigest()[:16].encode()


def _record(kind: str, tag: bytes) -> bytes:
    return f"sharedfs {kind} node={tag.decode()}\n".encode().ljust(RECORD_SIZE)


def _parse(data: bytes, kind: str) -> bytes | None:
    found = _RECORD.fullmatch(data)
    return found.group(2) if found and found.group(1) == kind.encode() else None


def _say_once(key: str, message: str, *args: object) -> None:
    if key not in _said:
        _said.add(key)
        log.warning(message, *args)


#: Asks this process has honoured, by file identity: when it first let go for each.
_honoured: dict[tuple[int, int], float] = {}


class Handover:
    """The handover rule of one lock file on a mount whose clients cache for ``settle`` seconds."""

    def __init__(self, lock_file: str, settle: float, node_id: str, mode: int, poll_interval: float,
                 team: TeamCache | None = None) -> None:
        self.directory, base = os.path.split(lock_file)
        self.directory = self.directory or "."
        self.last, self.want = base + LAST_SUFFIX, base + WANT_SUFFIX
        self.settle = settle
        self.tag = _tag(node_id)
        self.mode = mode
        self.team = team  # a team cache's files get its group and mode, as the lock's own do
        #: The record already names this node (read by this hold's arrive): its release writes nothing.
        self.recorded = False
        #: A waiter asks for a turn after this long; a holder honours one ask this long at most.
        self.ask_after = settle + 2 * poll_interval
        self.honour_for = 2 * settle + 4 * poll_interval + 2.0
        #: Asks are looked for at most every ``ask_every`` seconds (a lookup the server answers, per acquire
        #: where negative entries are not cached): an ask waits that much longer, a fast cycle pays less.
        self.ask_every = min(poll_interval, 0.5)
        self.asks_looked = float("-inf")

    # -- the new holder ---------------------------------------------------------------------------

    def arrive(self) -> None:
        """Before ``acquire()`` returns: let go for another node's ask (:class:`Yield`), or wait out its caches."""
        try:
            where = Directory.open(self.directory)
        except OSError:
            previous = None
        else:
            with where:
                now = time.monotonic()
                if now - self.asks_looked >= self.ask_every:
                    self.asks_looked = now
                    self._honour_ask(where)
                previous = self._previous(where)
        self.recorded = previous == self.tag
        if previous == self.tag:
            stats["same_node"] += 1
        elif previous == b"":
            stats["first"] += 1
        else:  # another node's, or cannot tell: every entry this node cached before its writes expires meanwhile
            stats["waits"] += 1
            stats["waited"] += self.settle
            time.sleep(self.settle)

    def _previous(self, where: Directory) -> bytes | None:
        """The last holder's node tag; ``b""`` for a lock nobody released yet; ``None``: cannot tell."""
        try:
            fd = where.open_file(self.last, os.O_RDONLY)
        except FileNotFoundError:
            try:  # asked of the server (an exclusive create revalidates the name): nobody released it yet
                fd = where.create_exclusive(self.last, self.mode)
                share(fd, self.team)
                os.close(fd)
                return b""
            except OSError:
                return None  # created meanwhile by a node whose entry this one does not see yet
        except OSError:
            return None  # ESTALE (replaced elsewhere), not a file we may read: cannot tell
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            # In place on one inode: the server has the last write; this node's page cache may not.
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            return _parse(os.pread(fd, RECORD_SIZE, 0), "last")
        except OSError:
            return None
        finally:
            _close_quietly(fd)

    def _honour_ask(self, where: Directory) -> None:
        try:
            got = where.read_untrusted(self.want)
        except OSError:  # none, or one replaced meanwhile (ESTALE): no ask to honour
            return
        if got is None:
            return
        tag = _parse(got[0], "want")
        if tag is None:
            return
        asked = identity(got[1])
        if tag != self.tag:
            now = time.monotonic()
            first = _honoured.setdefault(asked, now)
            if now - first > 3 * self.honour_for:  # long gone: this is a new ask on a recycled inode number
                first = _honoured[asked] = now
            if now - first < self.honour_for:
                stats["yields"] += 1
                raise Yield
        # This node's turn came (or the asker never took it): the ask is answered.
        where.discard_if_same(self.want, asked)
        _honoured.pop(asked, None)

    # -- the holder letting go ----------------------------------------------------------------------

    def depart(self) -> None:
        """While still holding: record this node as the last holder.  Never raises."""
        if self.recorded:
            return  # a same-node handover: the record says so already (a write is the dearest step on JuiceFS)
        try:
            with Directory.open(self.directory) as where:
                try:
                    self._write(where, os.O_WRONLY | os.O_CREAT)
                except OSError:
                    # Not ours to write (another user's, no group write), or not a file sharedfs wrote: an older
                    # record must not speak for this holder, so a file of this holder's own takes its name.
                    where.unlink_quietly(self.last)
                    try:
                        self._write(where, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
                    except OSError as exc:
                        _say_once(self.last, "could not record this node as the last holder of the lock in %s "
                                  "(%s): a holder on another node may read what this one replaced through its "
                                  "stale cache for a few seconds. Let every user of the lock write it: chmod g+w "
                                  "%s (or remove it)", where.join(self.last), exc, where.join(self.last))
        except OSError:
            pass

    def _write(self, where: Directory, flags: int) -> None:
        # O_NOFOLLOW|O_NONBLOCK: never through a planted link, never blocked on a FIFO.
        fd = os.open(self.last, flags | NOFOLLOW, self.mode, dir_fd=where.fd)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
                # A second name may be another file of this user's that someone linked here: never written.
                raise OSError(errno.EMLINK, "not a record file of its own", where.join(self.last))
            share(fd, self.team)
            if os.pwrite(fd, _record("last", self.tag), 0) != RECORD_SIZE:
                raise OSError(errno.EIO, "short write")
        finally:
            os.close(fd)  # the close sends the write to the server
        self.recorded = True

    # -- a waiter ---------------------------------------------------------------------------------

    def ask(self) -> None:
        """Ask holders on other nodes for a turn (an existing ask, anyone's, already does)."""
        try:
            with Directory.open(self.directory) as where:
                fd = where.create_exclusive(self.want, self.mode)
                try:
                    share(fd, self.team)
                    os.write(fd, _record("want", self.tag))
                finally:
                    os.close(fd)
        except OSError:
            pass


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass

"""One lock file as read back: its row, its state and the evidence, in the words of the one liveness rule.

Made by the readers beside each format's writer: markerfiles, nativeprobe, torchbaton, shardcache.coordination.
"""

from __future__ import annotations

import stat
from dataclasses import dataclass, field
from typing import Any, Protocol

from sharedfs.fs.directory import Directory
from sharedfs.locks import _marker
from sharedfs.model.records import HolderRecord, user_name

__all__ = ["BREAK_TURN", "DEAD", "FREE", "HELD", "MARKER", "NATIVE", "OWN_NAME", "SHARD_CLAIM", "SHARD_READER",
           "TOO_DEEP", "TORCH_BATON", "UNKNOWN", "Looker", "Row", "judge", "not_a_record", "read"]

HELD, DEAD, UNKNOWN, FREE = "held", "dead", "unknown", "free"
#: Row kinds: what the file is (the lock's own kind, for a marker, is the holder's ``lock_kind``).
MARKER, NATIVE, OWN_NAME, BREAK_TURN = "marker", "native", "own-name", "break-turn"
SHARD_CLAIM, SHARD_READER, TORCH_BATON = "shard-claim", "shard-reader", "torch-baton"
#: Not a lock: a directory MAX_DEPTH below a PATH, not walked (``unknown``: what is below it nobody looked at).
TOO_DEEP = "too-deep"


class Looker(Protocol):
    """What a reader needs of the walk: its filesystem calls accounted, and this node's kernel locks."""

    def call(self, n: int = 1) -> None: ...

    def proc_locks(self) -> dict[tuple[int, int, int], list[tuple[str, int]]]: ...


@dataclass
class Row:
    """One lock as ``sharedfs locks`` saw it."""

    lock: str  # the lock's name: the lock file a program locks (``x.lock`` for ``x.lock.held``)
    kind: str
    state: str
    evidence: str
    file: str  # the file this row was read from
    record: HolderRecord | None = None
    owner: int | None = None  # uid owning the file
    changed: float | None = None  # the file's mtime, for rows without a record
    cleared: bool | None = None  # --clear-dead: True when this run removed it
    #: What --clear-dead needs: the marker as read (its bytes and identity), or None when never clearable.
    seen: _marker.Seen | None = field(default=None, repr=False)
    native_holder: dict[str, Any] | None = None
    #: Where ``file`` is, for --clear-dead: its directory as the walk reached it, and its name there.
    place: Any = field(default=None, repr=False)  # the walker's Place
    name: str = ""

    @property
    def since(self) -> float | None:
        return self.record.acquired_at if self.record is not None else self.changed

    @property
    def user(self) -> str | None:
        uid = self.record.uid if self.record is not None and self.record.uid is not None else self.owner
        return user_name(uid) if uid is not None else None

    def holder(self) -> dict[str, Any] | None:
        if self.native_holder is not None:
            return self.native_holder
        record = self.record
        if record is None:
            return None
        return {"user": self.user, "uid": record.uid, "node": record.node, "host": record.host or None,
                "pid": record.pid, "boot": record.boot_id, "job": record.slurm_job, "step": record.slurm_step,
                "since": record.acquired_at, "lock_kind": record.kind}

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"lock": self.lock, "kind": self.kind, "state": self.state, "holder": self.holder(),
               "evidence": self.evidence, "file": self.file}
        if self.cleared is not None:
            out["cleared"] = self.cleared
        return out


def read(where: Directory, name: str, walk: Looker) -> _marker.Seen | None:
    walk.call(4)  # open, fstat, read, close
    return _marker.read_in(where, name)


def not_a_record(where: Directory, name: str, walk: Looker) -> tuple[str, int | None, float | None]:
    """What sits at ``name`` that sharedfs never writes: its description, owner and age (one lstat)."""
    walk.call()
    try:
        st = where.lstat(name)
    except OSError as exc:
        return f"it cannot be looked at ({exc.strerror})", None, None
    mode = st.st_mode
    what = ("a symlink" if stat.S_ISLNK(mode) else "a FIFO" if stat.S_ISFIFO(mode) else
            "a directory" if stat.S_ISDIR(mode) else "a socket or device" if not stat.S_ISREG(mode) else
            f"a file of {st.st_size} bytes (records are at most a few hundred)" if st.st_size > 4096 else
            "a file this user may not read")
    return what, st.st_uid, st.st_mtime


def judge(record: HolderRecord) -> tuple[str, str]:
    """(state, evidence) of a holder record: the ``sharedfs_holder_alive`` hook's answer, in words.

    ``unchanged_for`` is ``None``: this command has not watched the marker, so a lease is not
    judged by its expiry here (its waiters do that), only by the evidence for its process.
    """
    from sharedfs.machinery import runtime

    policy = runtime.policy()
    alive = runtime.registry().holder_alive(record, policy, None)
    local = record.node == policy.node_id and policy.node_id_trusted and record.same_process_space()
    job = f"{record.slurm_job}" + (f".{record.slurm_step}" if record.slurm_step else "") if record.slurm_job else ""
    if alive is True:
        if local:
            return HELD, f"pid {record.pid} is running on this node"
        if job:
            return HELD, f"Slurm reports job {job} as still active"
        return HELD, "a liveness plugin vouches for its holder"
    if alive is False:
        if local:
            return DEAD, (f"pid {record.pid} is gone from this node (same boot and PID namespace as the record), "
                          "or now belongs to a process that started later")
        if job:
            return DEAD, f"Slurm reports that job {job} ended"
        return DEAD, "a liveness plugin says its holder is gone"
    return UNKNOWN, _undecidable(record, policy, job)


def _undecidable(record: HolderRecord, policy: Any, job: str) -> str:
    """Why nobody here can tell, and what would make it decidable."""
    if record.node == policy.node_id and not policy.node_id_trusted:
        return (f"its record names node {record.node}, which is this process's node id, but that id conflicts with "
                "the scheduler's (see `sharedfs status`): unset SHAREDFS_NODE_ID and look again")
    if record.node == policy.node_id:
        return (f"its record names this node ({record.node}) but another boot or PID namespace (the node "
                "rebooted, a container, or two machines share the name): its pid means nothing here"
                + (f"; Slurm could not be asked about job {job}" if job else ""))
    scheduler = (f"Slurm could not be asked about job {job} (squeue/scontrol missing or not answering, or the "
                 "slurm plugin off): asking it from a node where squeue works also decides"
                 if job else "its record names no Slurm job to ask the scheduler about")
    return (f"it ran on node {record.node}, whose processes nobody here can see, and {scheduler}. To decide, run "
            f"this command on {record.node} (`ssh {record.node}` or `srun -w {record.node}`)")


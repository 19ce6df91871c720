"""Holder records: who holds a lock (or uses a shard, or a job directory), written where waiters can read it.

Untrusted input: :meth:`HolderRecord.parse` answers ``None`` (cannot tell) for anything but the exact shape.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from dataclasses import asdict, fields
from typing import Any, Mapping

from sharedfs.model.structs import frozen

__all__ = ["HolderRecord", "ProcessFacts", "process_facts", "process_start_time"]

#: The largest pid Linux can hand out (PID_MAX_LIMIT on 64-bit); anything above is not a pid.
PID_MAX = 4 * 1024 * 1024
#: Longest string field we accept (node names and job ids are short).
TEXT_MAX = 256


def _read_first_line(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.readline().strip() or None
    except OSError:
        return None


def process_start_time(pid: int) -> str | None:
    """The start time of ``pid`` in clock ticks since boot (``/proc/<pid>/stat`` field 22), or ``None``."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            # The command name may contain spaces and parentheses: split after the last ')'.
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


#: The title slurmstepd gives itself: ``slurmstepd: [JOB.STEP]`` (``batch``/``extern``/``interactive`` named).
#: (A string: compiled, and cached by re, only in a process under slurmstepd.)
_STEPD_TITLE = rb"slurmstepd: \[([0-9]+)\.([0-9]+|batch|extern|interactive)\]"


def _slurm_step() -> tuple[str, str] | None:
    """(job, step) of the nearest ``slurmstepd`` ancestor, or ``None`` when none is visible.

    Not ``SLURM_STEP_ID``: Slurm sets none in a batch script, so there it is whatever the
    environment of ``sbatch`` held (typed in an ``srun --pty bash`` session: that session's
    step), and a waiter would take the holder for a step of its new job that never ran.  The
    slurmstepd a process runs under names its job (a heterogeneous job's component) and step.
    """
    pid = os.getpid()
    for _ in range(64):
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                head, tail = fh.read().rsplit(b")", 1)
            comm, ppid = head.split(b"(", 1)[1], int(tail.split()[1])
            if comm == b"slurmstepd":
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    found = re.match(_STEPD_TITLE, fh.read(256))
                return (found.group(1).decode(), found.group(2).decode()) if found else None
        except (OSError, ValueError, IndexError):
            return None
        if ppid <= 1:
            return None
        pid = ppid
    return None


def _pid_namespace() -> str | None:
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return None


@frozen
class ProcessFacts:
    """What this process writes into records about itself.  Computed once per pid (a fork gets its own)."""

    pid: int
    start_time: str | None
    boot_id: str | None
    pidns: str | None
    host: str
    uid: int
    slurm_step: tuple[str, str] | None = None  # (job, step) of the slurmstepd this process runs under


_facts: ProcessFacts | None = None


def process_facts() -> ProcessFacts:
    global _facts
    if _facts is None or _facts.pid != os.getpid():
        pid = os.getpid()
        _facts = ProcessFacts(
            pid=pid,
            start_time=process_start_time(pid),
            boot_id=_read_first_line("/proc/sys/kernel/random/boot_id"),
            pidns=_pid_namespace(),
            host=socket.gethostname(),
            uid=os.getuid(),
            slurm_step=_slurm_step(),
        )
    return _facts


@frozen
class HolderRecord:
    """Who holds something.  ``kind`` says what: a lock kind, ``inuse`` (a shard reader), ``user`` (a job dir)."""

    node: str
    pid: int
    acquired_at: float
    kind: str
    host: str = ""
    start_time: str | None = None
    boot_id: str | None = None
    pidns: str | None = None
    uid: int | None = None
    slurm_job: str | None = None
    slurm_step: str | None = None
    slurm_node: str | None = None
    #: For ``kind == "lease"``: the holder renews its marker at least this often, else it is gone.
    lease_seconds: float | None = None

    @classmethod
    def mine(cls, node: str, kind: str, environ: Mapping[str, str] = os.environ,
             lease_seconds: float | None = None) -> HolderRecord:
        """A record describing this process, now."""
        facts = process_facts()
        return cls(
            node=node, pid=facts.pid, acquired_at=time.time(), kind=kind, host=facts.host,
            start_time=facts.start_time, boot_id=facts.boot_id, pidns=facts.pidns, uid=facts.uid,
            # The step only from slurmstepd (see _slurm_step); without one, the job alone (its liveness).
            slurm_job=facts.slurm_step[0] if facts.slurm_step else _clean(environ.get("SLURM_JOB_ID")),
            slurm_step=facts.slurm_step[1] if facts.slurm_step else None,
            slurm_node=_clean(environ.get("SLURMD_NODENAME")), lease_seconds=lease_seconds,
        )

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def parse(cls, data: bytes) -> HolderRecord | None:
        """The record in ``data``, or ``None`` when it is not exactly a record we could have written."""
        try:
            obj = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            return None
        if not isinstance(obj, dict):
            return None
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in obj:
                if f.name in _REQUIRED:
                    return None
                continue
            value = obj[f.name]
            if not _SCHEMA[f.name](value):
                return None
            values[f.name] = value
        return cls(**values)

    def same_process_space(self) -> bool:
        """True when this record's pid can be checked here: same boot of the same kernel, same PID namespace."""
        facts = process_facts()
        return (self.boot_id is not None and self.pidns is not None
                and self.boot_id == facts.boot_id and self.pidns == facts.pidns)

    def describe(self, now: float | None = None) -> str:
        age = max(0.0, (now or time.time()) - self.acquired_at)
        job = ""
        if self.slurm_job:
            job = f", Slurm job {self.slurm_job}" + (f".{self.slurm_step}" if self.slurm_step else "")
        return f"pid {self.pid} on node {self.node}{job}, held for {age:.0f} s"


def _clean(value: str | None) -> str | None:
    value = (value or "").strip()
    return value[:TEXT_MAX] if value else None


def _text(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= TEXT_MAX


def _optional_text(value: Any) -> bool:
    return value is None or _text(value)


def _seconds(value: Any) -> bool:
    # bool is an int subclass; a float past ~year 5000 or NaN is not a time we wrote.
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1e11


_REQUIRED = {"node", "pid", "acquired_at", "kind"}
_SCHEMA = {
    "node": _text,
    "pid": lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 < v <= PID_MAX,
    "acquired_at": _seconds,
    "kind": _text,
    "host": lambda v: isinstance(v, str) and len(v) <= TEXT_MAX,
    "start_time": lambda v: v is None or (isinstance(v, str) and v.isdigit() and len(v) < 32),
    "boot_id": _optional_text,
    "pidns": _optional_text,
    "uid": lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**32),
    "slurm_job": _optional_text,
    "slurm_step": _optional_text,
    "slurm_node": _optional_text,
    "lease_seconds": lambda v: v is None or (_seconds(v) and 0 < v <= 86400),
}


def user_name(uid: int) -> str:
    """The login name of ``uid`` for messages, or the number when the user database has none."""
    import pwd  # only messages about other users' files need it

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def group_name(gid: int) -> str:
    """The name of group ``gid`` for messages, or the number when the group database has none."""
    import grp

    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)

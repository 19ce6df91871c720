"""Slurm: node identity and ranks from ``SLURM_*`` variables, and whether a lock holder's job step still runs.

When a holder counts as gone, and why one ``squeue`` per node answers every rank there: docs/slurm.md,
"How sharedfs tells a killed job's holder is gone".
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import re
import shutil
import stat
import subprocess
import threading
import time
import zlib
from collections.abc import Mapping
from dataclasses import asdict, fields
from typing import Any

from sharedfs.types import (
    NOFOLLOW,
    HolderRecord,
    Layer,
    Policy,
    ProcessIdentity,
    frozen,
    hookimpl,
    lock_by,
    publish,
    read_untrusted,
)

SLURM_PRIORITY = 150  # above the TOML file (100), below SHAREDFS_* (200)


@hookimpl
def sharedfs_settings_layers(environ: Mapping[str, str]) -> list[Layer]:
    node = environ.get("SLURMD_NODENAME", "").strip()
    if not node:
        return []
    return [Layer("slurm", SLURM_PRIORITY, {"node_id": node}, {"node_id": "SLURMD_NODENAME"}, authoritative=True)]


@hookimpl
def sharedfs_process_identity(environ: Mapping[str, str]) -> ProcessIdentity | None:
    try:
        rank = int(environ["SLURM_PROCID"])
        world = int(environ["SLURM_NTASKS"])
        local_rank = int(environ.get("SLURM_LOCALID", "0"))
    except (KeyError, ValueError):
        return None
    # SLURM_TASKS_PER_NODE looks like "4(x2),3"; this node's count is not in it directly,
    # and a step may be uneven, so only the common single-value form is trusted.
    per_node = environ.get("SLURM_NTASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE", "1")
    try:
        local_world = int(per_node.split("(")[0].split(",")[0])
    except ValueError:
        local_world = 1
    return ProcessIdentity(rank, world, local_rank, local_world, node_id=environ.get("SLURMD_NODENAME", ""),
                           source="slurm")


# -- is a lock holder's job step still alive? ----------------------------------------------------

#: Job states in which the job's processes may still exist (``squeue -o %T`` names).  Anything
#: not listed here and not in DEAD_STATES is unknown to us and answered "cannot tell".
ALIVE_STATES = frozenset({
    "CONFIGURING", "COMPLETING", "PENDING", "RESIZING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD",
    "RESV_DEL_HOLD", "RUNNING", "SIGNALING", "SPECIAL_EXIT", "STAGE_OUT", "STOPPED", "SUSPENDED",
})
#: States after which the job's processes are gone (a requeued job gets new processes).
DEAD_STATES = frozenset({
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
    "PREEMPTED", "REVOKED", "TIMEOUT",
})
#: Waiters poll several times a second; each node asks the scheduler at most once per key per CACHE_SECONDS.
CACHE_SECONDS = 2.0
#: Queries per second one whole job makes about one holder (see the module doc); below rl_enable's default refill.
JOB_QUERY_RATE = 1.0
#: squeue retries an unreachable controller for a minute by default; a waiter must not hang on it.
QUERY_TIMEOUT = 5.0
#: A step (or running job) that started this much later than the holder took its lock is a later
#: incarnation.  Generous: nodes whose clocks differ by minutes cannot authenticate to slurmctld
#: anyway (MUNGE credentials live 300 s by default), and erring here would break a live lock.
CLOCK_SLACK = 300.0

#: What the record may name, and all that is ever passed to squeue/scontrol (the record is untrusted):
#: a job id, an array task ``123_4`` or a heterogeneous component ``123+1`` ...  (Patterns for
#: ``re.fullmatch``, compiled on first use and cached by ``re``, not at every framework's import.)
JOB_ID = r"[1-9][0-9]{0,9}(?:_[0-9]{1,10}|\+[0-9]{1,5})?"
#: ... and a step: a number, or the name squeue prints for a special step.
STEP_ID = r"[0-9]{1,10}|batch|extern|interactive"
#: SLURM_STEP_ID of the special steps is their number (slurm.h: SLURM_INTERACTIVE_STEP,
#: SLURM_BATCH_SCRIPT, SLURM_EXTERN_CONT); squeue names them.  0xfffffffd (a pending step) has no processes.
SPECIAL_STEPS = {0xFFFFFFFA: "interactive", 0xFFFFFFFB: "batch", 0xFFFFFFFC: "extern"}
MAX_NORMAL_STEP = 0xFFFFFFF0
#: A node name as slurm.conf can spell it (never an option: no leading '-').
NODE_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"

log = logging.getLogger("sharedfs")
_cache: dict[str, tuple[float, SlurmFacts]] = {}
_cache_lock = threading.Lock()
_warned: set[str] = set()


@hookimpl
def sharedfs_holder_alive(record: HolderRecord, policy: Policy) -> bool | None:
    """Ask Slurm about a holder whose record names a job.

    Registered without ``tryfirst``: the ``liveness`` plugin (``tryfirst``) answers first from
    exact local evidence (same node, boot and PID namespace); only what it cannot tell comes here.
    """
    job = job_id(record.slurm_job)
    if job is None:
        return None
    step = step_id(record.slurm_step)
    if record.slurm_step is not None and step is None:
        return None  # a step we could not have written: no claim
    facts = _facts(job, step)
    if facts.error is not None:
        _warn_unreachable(job, facts.error)
        return None
    return decide(facts, step, record.slurm_node or record.node, record.acquired_at)


def job_id(text: str | None) -> str | None:
    """``text`` if it is a job id squeue accepts (``123``, ``123_4``, ``123+1``), else ``None``."""
    text = (text or "").strip()
    return text if re.fullmatch(JOB_ID, text) else None


def step_id(text: str | None) -> str | None:
    """The step as squeue names it (``0``, ``batch``, ``extern``, ``interactive``), or ``None``."""
    text = (text or "").strip()
    if not re.fullmatch(STEP_ID, text):
        return None
    if not text.isdigit():
        return text
    number = int(text)
    if number in SPECIAL_STEPS:
        return SPECIAL_STEPS[number]
    return str(number) if number <= MAX_NORMAL_STEP else None


@frozen
class SlurmFacts:
    """What Slurm said about one job and one of its steps: all that is cached and shared between processes."""

    #: The job's state (``squeue %T``), ``UNKNOWN`` when Slurm does not know the job; ``None`` when not
    #: asked (the step was listed, which says enough) or when Slurm could not be asked.
    state: str | None = None
    #: When the listed step, or else the job, started (epoch seconds), if Slurm said.
    started: float | None = None
    step_listed: bool = False
    #: A heterogeneous job: its components' steps are not named by SLURM_JOB_ID.SLURM_STEP_ID.
    het: bool = False
    #: Why Slurm could not be asked (then nothing else is known).
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: Any) -> SlurmFacts | None:
        """The facts in ``obj`` (a cache file's, so untrusted), or ``None`` if it is not exactly what we write."""
        if not isinstance(obj, dict) or set(obj) != {f.name for f in fields(cls)}:
            return None
        ok = (_optional_text(obj["state"], 32) and _optional_text(obj["error"], 1024)
              and (obj["started"] is None or _number(obj["started"]))
              and isinstance(obj["step_listed"], bool) and isinstance(obj["het"], bool))
        return cls(**obj) if ok else None


def decide(facts: SlurmFacts, step: str | None, node: str | None, acquired_at: float | None) -> bool | None:
    """Whether the holder of step ``step`` of the job described by ``facts`` may still exist.

    ``node`` is the holder's Slurm node: a job id this cluster does not know proves nothing when
    that node is not this cluster's either (two clusters sharing one filesystem).
    """
    if facts.error is not None:
        return None
    current = facts.step_listed or facts.state == "RUNNING"  # `started` is then a real start, not a plan
    if current and facts.started and acquired_at and facts.started > acquired_at + CLOCK_SLACK:
        return False  # started after the holder locked: a requeued job's new incarnation
    if facts.step_listed:
        return True
    state = facts.state
    if state == "UNKNOWN":
        # Purged after MinJobAge, or never existed here.  A site that hides other users' jobs
        # (PrivateData=jobs) answers the same for a live job of someone else: then we cannot tell.
        if _jobs_private():
            return None
        if node is not None and not _node_known(node):
            return None  # another cluster's job: its id means nothing to our controller
        return False
    if state in DEAD_STATES:
        return False
    if state not in ALIVE_STATES:
        return None
    # A running job that no longer lists the holder's step: that step ended (srun returned,
    # scancel JOB.STEP, a task that died) and took its processes with it.
    step_ended = step is not None and state == "RUNNING" and not facts.het
    return not step_ended


def job_alive(job: str, node: str | None = None) -> bool | None:
    """Whether job ``job`` may still have processes (asked now, not cached); ``None``: cannot tell."""
    if job_id(job) is None:
        return None
    facts = _ask(job, None)
    if facts.error is not None:
        _warn_unreachable(job, facts.error)
        return None
    return decide(facts, None, node, None)


def _warn_unreachable(job: str, error: str) -> None:
    _warn_once(error, f"cannot ask Slurm whether job {job} still runs ({error}); locks held by "
               "its processes on other nodes are waited out (SHAREDFS_WAIT_TIMEOUT) instead of broken")


# -- asking the scheduler --------------------------------------------------------------------------


def _ask(job: str, step: str | None) -> SlurmFacts:
    """Ask Slurm: first whether the step is listed (while the holder lives, that is the only query),
    then, when it is not, the job's state."""
    if step is not None and "+" not in job:
        steps = _list_steps(job)
        if isinstance(steps, str):
            return SlurmFacts(error=steps)
        if step in steps:
            return SlurmFacts(started=steps[step], step_listed=True)
    return _job_facts(job)


def _list_steps(job: str) -> dict[str, float | None] | str:
    """{step: start} of the job's current steps, or why Slurm could not be asked.

    squeue 22.05 reads ``-s JOB.batch`` as step 0, and ``squeue -j`` of an array's base id lists
    every task, so all steps are listed and filtered on the job id squeue prints beside them.
    """
    squeue = shutil.which("squeue")
    failed = None
    if squeue:
        result = _query([squeue, "-h", "--all", "-s", "-j", job, "-O", "JobId:|,StepId:|,StartTime:|"])
        if isinstance(result, str):
            return result
        rc, out, err = result
        if rc == 0:
            steps: dict[str, float | None] = {}
            for line in filter(None, map(str.strip, out.splitlines())):
                parts = line.split("|")
                if len(parts) != 4 or "." not in parts[1]:
                    # Never read "not listed" into output we do not understand (an squeue without -O suffixes).
                    return f"cannot read `squeue -s` output: {line[:100]!r}"
                listed, name = parts[1].rsplit(".", 1)
                if job in (parts[0], listed):  # the raw id (123), or the array form (123_4) as asked
                    steps[name] = _epoch(parts[2])
            return steps
        failed = f"squeue -s failed (exit {rc}): {err.strip()[:200]}"
    scontrol = shutil.which("scontrol")
    if not scontrol:
        return failed or "neither squeue nor scontrol is on PATH"
    result = _query([scontrol, "-o", "show", "step", job])
    if isinstance(result, str):
        return result
    rc, out, err = result
    if rc != 0:
        text = (out + err).lower()
        if "invalid job id" in text or "not found" in text:
            return {}
        return f"scontrol show step {job} failed (exit {rc}): {(err or out).strip()[:200]}"
    # scontrol prints no raw job id beside an array task's steps, so a step of the same number
    # in a sibling task counts as listed: the safe direction (wait) for this fallback.
    steps = {}
    for line in out.splitlines():
        values = _fields(line)
        if "." in values.get("StepId", ""):
            steps[values["StepId"].rsplit(".", 1)[1]] = _epoch(values.get("StartTime", ""))
    return steps


def _job_facts(job: str) -> SlurmFacts:
    """The job's state and start from ``squeue`` (``scontrol`` as fallback); ``UNKNOWN`` if Slurm does not know it."""
    squeue = shutil.which("squeue")
    failed = None
    if squeue:
        # --states=all: without it squeue omits finished jobs; --all: and jobs in hidden partitions.
        result = _query([squeue, "-h", "--all", "--states=all", "-j", job, "-o", "%A|%i|%T|%S"])
        if isinstance(result, str):
            return SlurmFacts(error=result)
        rc, out, err = result
        if rc == 0:
            # One line per array task / het component: pick the job asked for, by raw id or as written.
            rows = [line.split("|") for line in filter(None, map(str.strip, out.splitlines()))]
            if any(len(row) != 4 for row in rows):
                return SlurmFacts(error=f"cannot read squeue output: {out.strip()[:100]!r}")
            het = any("+" in row[1] for row in rows)
            for raw, shown, state, start in rows:
                if job in (raw, shown):
                    return SlurmFacts(state=state, started=_epoch(start), het=het)
            return SlurmFacts(state="UNKNOWN", het=het)
        if "invalid job id" in err.lower():
            return SlurmFacts(state="UNKNOWN")
        failed = f"squeue failed (exit {rc}): {err.strip()[:200]}"
    scontrol = shutil.which("scontrol")
    if not scontrol:
        return SlurmFacts(error=failed or "neither squeue nor scontrol is on PATH")
    result = _query([scontrol, "-o", "show", "job", job])
    if isinstance(result, str):
        return SlurmFacts(error=result)
    rc, out, err = result
    if rc != 0:
        if "invalid job id" in (out + err).lower():
            return SlurmFacts(state="UNKNOWN")
        return SlurmFacts(error=f"scontrol show job {job} failed (exit {rc}): {(err or out).strip()[:200]}")
    records = [_fields(line) for line in out.splitlines()]
    het = any("HetJobId" in values for values in records)
    for values in records:
        names = {values.get("JobId"), f"{values.get('ArrayJobId')}_{values.get('ArrayTaskId')}",
                 f"{values.get('HetJobId')}+{values.get('HetJobOffset')}"}
        if job in names and "JobState" in values:
            return SlurmFacts(state=values["JobState"], started=_epoch(values.get("StartTime", "")), het=het)
    if records and any("JobState" in values for values in records):
        return SlurmFacts(state="UNKNOWN", het=het)
    return SlurmFacts(error=f"scontrol show job {job} printed no JobState")


def _fields(line: str) -> dict[str, str]:
    """``Key=value`` pairs of one ``scontrol -o`` line (values with spaces come out cut, which we never read)."""
    return dict(item.split("=", 1) for item in line.split() if "=" in item)


def _epoch(text: str) -> float | None:
    """A time squeue/scontrol printed under SLURM_TIME_FORMAT=%s; ``None`` for Unknown, N/A, ..."""
    text = text.strip()
    return float(text) if text.isdigit() and len(text) <= 12 else None


def _query(argv: list[str]) -> tuple[int, str, str] | str:
    # SLURM_TIME_FORMAT=%s: start times as epoch seconds, free of the time zone and its DST switch.
    env = {**os.environ, "SLURM_TIME_FORMAT": "%s"}
    try:
        proc = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=QUERY_TIMEOUT,
                              stdin=subprocess.DEVNULL, env=env)
    except subprocess.TimeoutExpired:
        return f"`{' '.join(argv)}` did not answer within {QUERY_TIMEOUT:g} s"
    except OSError as exc:
        return f"`{argv[0]}` could not run: {exc}"
    return proc.returncode, proc.stdout, proc.stderr


_nodes: dict[str, bool] = {}


def _node_known(node: str) -> bool:
    """Whether ``node`` is a node of the cluster our Slurm commands talk to (asked once per node)."""
    if node not in _nodes:
        scontrol = shutil.which("scontrol")
        # The name comes from an untrusted record: only a plain node name reaches the command line.
        plain = re.fullmatch(NODE_NAME, node) is not None
        result = _query([scontrol, "show", "node", node]) if scontrol and plain else "not asked"
        # Not knowing counts as "not ours": the safe direction is not breaking the lock.
        _nodes[node] = not isinstance(result, str) and result[0] == 0 and f"NodeName={node} " in result[1]
    return _nodes[node]


_private: list[bool] = []


def _jobs_private() -> bool:
    """Whether Slurm hides other users' jobs from us (``PrivateData=jobs``); asked once per process."""
    if not _private:
        hidden = os.geteuid() != 0
        scontrol = shutil.which("scontrol")
        if scontrol and hidden:
            result = _query([scontrol, "show", "config"])
            if not isinstance(result, str) and result[0] == 0:
                for line in result[1].splitlines():
                    if line.split("=")[0].strip() == "PrivateData":
                        value = line.split("=", 1)[1].lower()
                        hidden = "jobs" in value or "all" in value
                        break
                else:
                    hidden = False
        _private.append(hidden)
    return _private[0]


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message)


# -- one query per node: answers shared by the user's processes on the node ----------------------

#: Internal switch: off, each process caches for itself (tests measure that baseline with it).
SHARED_CACHE = True
#: Node-local memory, where ``sharedfs-<uid>/slurm`` (0700) holds the shared answers.  $XDG_RUNTIME_DIR
#: (per user, usually tmpfs) is tried after these.
SHARED_PARENTS: tuple[str, ...] = ("/dev/shm",)
#: Cache files are a few hundred bytes; anything longer is not ours.
CACHE_FILE_LIMIT = 2048
#: Entries nobody refreshed for this long belong to holders nobody waits for any more.
STALE_SECONDS = 3600.0

_shared_dir_memo: list[str | None] = []


def _facts(job: str, step: str | None) -> SlurmFacts:
    """Slurm's facts about (job, step), at most CACHE_SECONDS old; asked by one process per node at a time."""
    # The cluster is part of the key: one machine may talk to several (SLURM_CONF), with clashing job ids.
    cluster = zlib.crc32(os.environ.get("SLURM_CONF", "").encode())
    key = f"{cluster:08x}-{job}.{step or 'job'}"
    now = time.time()
    with _cache_lock:
        hit = _cache.get(key)
    if hit and _fresh(hit[0], now):
        return hit[1]
    directory = _shared_dir() if SHARED_CACHE else None
    if directory is None:
        expires, facts = time.time() + _lifetime(), _ask(job, step)
    else:
        expires, facts = _shared_facts(directory, key, job, step)
    with _cache_lock:
        _cache[key] = (expires, facts)
    return facts


def _fresh(expires: float, now: float) -> bool:
    # The upper bound: an entry from a clock that later jumped back must not live on.
    return now < expires <= now + 1.25 * _mean_lifetime()


def _job_nodes() -> int:
    """How many nodes this process's job has (1 outside Slurm, or when Slurm does not say)."""
    for name in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
        value = os.environ.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def _mean_lifetime() -> float:
    return max(CACHE_SECONDS, _job_nodes() / JOB_QUERY_RATE)


def _lifetime() -> float:
    """How long this node reuses an answer: +-25 % at random in a big job, so that its nodes ask out of step."""
    mean = _mean_lifetime()
    return mean * random.uniform(0.75, 1.25) if mean > CACHE_SECONDS else CACHE_SECONDS


def _shared_facts(directory: str, key: str, job: str, step: str | None) -> tuple[float, SlurmFacts]:
    """Fresh facts from the node's cache file; else ask Slurm under a per-key flock and publish the answer.

    flock is exact between the processes of one node (the directory is node-local), so N ranks
    that find the answer expired run one squeue: the first asks, the others wait for the flock
    and then read what it wrote.  The flock only saves queries; correctness never depends on it.
    """
    path = os.path.join(directory, key + ".json")
    cached = _read_cache(path, key)
    if cached and _fresh(cached[0], time.time()):
        return cached
    # The holder of the flock asks at most twice, each bounded by QUERY_TIMEOUT; a process that waits
    # longer (the holder is stopped, or flock fails here) asks for itself.
    fd = _flock(os.path.join(directory, key + ".lock"), time.monotonic() + 2 * QUERY_TIMEOUT + 1)
    try:
        if fd is not None:
            cached = _read_cache(path, key)
            if cached and _fresh(cached[0], time.time()):
                return cached  # another process asked while we waited
        facts = _ask(job, step)
        expires = time.time() + _lifetime()
        _write_cache(directory, path, key, expires, facts)
        return expires, facts
    finally:
        if fd is not None:
            os.close(fd)  # releases the flock


def _shared_dir() -> str | None:
    """This user's node-local cache directory (created 0700), or ``None``: then each process caches for itself."""
    if not _shared_dir_memo:
        parents = [*SHARED_PARENTS, os.environ.get("XDG_RUNTIME_DIR", "")]
        found = next((d for d in (_private_dir(p) for p in parents if os.path.isabs(p)) if d), None)
        if found:
            _sweep(found)
        _shared_dir_memo.append(found)
    return _shared_dir_memo[0]


def _private_dir(parent: str) -> str | None:
    """``parent/sharedfs-<uid>/slurm``, or ``None`` unless each level is a real directory, ours, writable by us only.

    Anyone can create ``/dev/shm/sharedfs-<our uid>`` first (a directory of theirs, a symlink):
    then we do not share answers on this node rather than read or write through it.
    """
    path = parent
    for name in (f"sharedfs-{os.geteuid()}", "slurm"):
        path = os.path.join(path, name)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError:
            return None
        try:
            st = os.lstat(path)
        except OSError:
            return None
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            log.info("not sharing Slurm answers between processes on this node: %s is not a directory "
                     "that only this user can write", path)
            return None
    return path


def _read_cache(path: str, key: str) -> tuple[float, SlurmFacts] | None:
    try:
        got = read_untrusted(path, CACHE_FILE_LIMIT)
    except FileNotFoundError:
        return None
    if got is None or got[1].st_uid != os.geteuid():
        return None
    try:
        obj = json.loads(got[0].decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or set(obj) != {"key", "expires", "facts"} or obj["key"] != key:
        return None
    facts = SlurmFacts.from_json(obj["facts"])
    if facts is None or not _number(obj["expires"]):
        return None
    return float(obj["expires"]), facts


def _write_cache(directory: str, path: str, key: str, expires: float, facts: SlurmFacts) -> None:
    """Publish the answer whole (sharedfs.fs.publish): the node's other ranks read it at any moment."""
    data = json.dumps({"key": key, "expires": expires, "facts": facts.to_json()}, separators=(",", ":"),
                      ensure_ascii=False)
    try:
        publish(path, data, perm=0o600, durable=False)  # node-local memory: nothing to make durable
    except OSError:
        pass  # a cache: the next rank asks the scheduler itself


def _flock(path: str, deadline: float) -> int | None:
    """An open descriptor of ``path`` holding an exclusive flock, or ``None`` if not got by ``deadline``."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | NOFOLLOW, 0o600)
    except OSError:
        return None
    try:
        if lock_by(fd, deadline, max_pause=0.01):  # the ranks of a node wait for one query: notice it at once
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def _sweep(directory: str) -> None:
    """Remove entries nobody refreshed for STALE_SECONDS (once per process; a removed lock file costs one query)."""
    cutoff = time.time() - STALE_SECONDS
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                try:
                    if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                        os.unlink(entry.path)
                except OSError:
                    pass
    except OSError:
        pass


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _optional_text(value: Any, limit: int) -> bool:
    return value is None or (isinstance(value, str) and len(value) <= limit)

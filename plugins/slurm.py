"""Slurm: node identity and ranks from ``SLURM_*`` variables, and whether a lock holder's job still runs.

Under Slurm the node's name is ``SLURMD_NODENAME`` (several slurmd on one host
share a host name but not a node name), contributed as a settings layer below
the environment so an explicit ``SHAREDFS_NODE_ID`` still wins.

A soft lock whose holder was killed with its job (scancel, preemption, time
limit, OOM) stays behind; filelock breaks it only for a dead pid on its own
host, so the rerun on another node hangs until someone deletes files by hand
(failures.md section 1; ishandhanani/srt-slurm#251, modelscope#1778).  The
holder record names the Slurm job, so a waiter on another node asks the
scheduler: a job that will never run again means the holder is gone.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Mapping

from sharedfs.hookspecs import hookimpl
from sharedfs.identity import ProcessIdentity
from sharedfs.locks import HolderRecord
from sharedfs._policy import Layer, Policy

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


# -- is a lock holder's job still alive? ---------------------------------------------------------

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
#: Waiters poll several times a second; the scheduler is asked at most once per job per CACHE_SECONDS.
CACHE_SECONDS = 2.0
#: squeue retries an unreachable controller for a minute by default; a waiter must not hang on it.
QUERY_TIMEOUT = 5.0

log = logging.getLogger("sharedfs")
_cache: dict[str, tuple[float, bool | None]] = {}
_cache_lock = threading.Lock()
_warned: set[str] = set()


@hookimpl
def sharedfs_holder_alive(record: HolderRecord, policy: Policy) -> bool | None:
    """Ask Slurm about a holder on *another* node whose record names a job (same node: the liveness plugin)."""
    job = (record.slurm_job or "").strip()
    if not job or record.node == policy.node_id:
        return None
    if not job.replace("_", "").isdigit():
        return None  # not a job id we can pass to squeue safely
    now = time.monotonic()
    with _cache_lock:
        cached = _cache.get(job)
        if cached and cached[0] > now:
            return cached[1]
    answer = job_alive(job, record.node)
    with _cache_lock:
        _cache[job] = (time.monotonic() + CACHE_SECONDS, answer)
    return answer


def job_alive(job: str, node: str | None = None) -> bool | None:
    """``True``: the job may still have processes; ``False``: it never will again; ``None``: cannot tell.

    ``node`` is the holder's node (its ``SLURMD_NODENAME``): a job id this cluster does not
    know proves nothing when that node is not this cluster's either (two clusters sharing one
    filesystem), so the answer is then ``None``.
    """
    state, error = job_state(job)
    if state is None:
        _warn_once(error or "no answer", f"cannot ask Slurm whether job {job} still runs ({error}); locks held by "
                   "its processes on other nodes are waited out (SHAREDFS_WAIT_TIMEOUT) instead of broken")
        return None
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
    if state in ALIVE_STATES:
        return True
    return None


def job_state(job: str) -> tuple[str | None, str | None]:
    """(state, error): the job's state from ``squeue`` (``scontrol`` as fallback), ``UNKNOWN`` if Slurm does not know it."""
    squeue = shutil.which("squeue")
    if squeue:
        # --states=all: without it squeue omits finished jobs; --all: and jobs in hidden partitions.
        result = _query([squeue, "-h", "--all", "--states=all", "-j", job, "-o", "%T"])
        if isinstance(result, str):
            return None, result
        rc, out, err = result
        if rc == 0:
            return (out.split()[0] if out.split() else "UNKNOWN"), None
        if "invalid job id" in err.lower():
            return "UNKNOWN", None
    scontrol = shutil.which("scontrol")
    if not scontrol:
        return None, "neither squeue nor scontrol is on PATH" if not squeue else f"squeue failed: {err.strip()}"
    result = _query([scontrol, "-o", "show", "job", job])
    if isinstance(result, str):
        return None, result
    rc, out, err = result
    if rc != 0:
        if "invalid job id" in (out + err).lower():
            return "UNKNOWN", None
        return None, f"scontrol show job {job} failed (exit {rc}): {(err or out).strip()[:200]}"
    for field in out.split():
        if field.startswith("JobState="):
            return field.split("=", 1)[1], None
    return None, f"scontrol show job {job} printed no JobState"


def _query(argv: list[str]) -> tuple[int, str, str] | str:
    try:
        proc = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=QUERY_TIMEOUT,
                              stdin=subprocess.DEVNULL)
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
        result = _query([scontrol, "show", "node", node]) if scontrol else "no scontrol"
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

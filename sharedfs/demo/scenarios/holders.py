"""Scenarios of an existence lock whose holder is on another node: dead (stale) or alive."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from .sim import Outcome, Sim, _unshare, fetch_old_filelock, last_error, run_py

HOLD = """
    import sys, time
    which, lock_file = sys.argv[1], sys.argv[2]
    if which == "filelock":
        import filelock
        lock = filelock.SoftFileLock(lock_file)
    else:
        import sharedfs
        lock = sharedfs.lock(lock_file)
    lock.acquire()
    print("held", flush=True)
    time.sleep(600)
"""
TAKE = """
    import sys, time
    which, lock_file = sys.argv[1], sys.argv[2]
    start = time.monotonic()
    if which == "filelock":
        import filelock
        filelock.SoftFileLock(lock_file, timeout=8).acquire()
    else:
        import sharedfs
        sharedfs.lock(lock_file, timeout=8).acquire()
    print(f"{time.monotonic() - start:.1f}")
"""


def other_host_prefix() -> list[str]:
    """Run a command as if on another host: its own UTS namespace and host name, so nothing here
    can probe its pid, exactly as across real nodes (a user namespace makes this work without root)."""
    return [*_unshare("--uts"), "sh", "-c", 'hostname node-a && exec "$0" "$@"']


def stale_lock(sim: Sim) -> tuple[Outcome, Outcome]:
    """A job on node A is killed while holding an existence lock; the rerun on node B must not hang."""
    prefix = other_host_prefix()
    outcomes = []
    for which, extra in (("filelock", {}), ("sharedfs", {"SHAREDFS_LOCK": "lease", "SHAREDFS_LEASE_SECONDS": "2"})):
        lock_dir = sim.work / f"stale-{which}"
        lock_dir.mkdir()
        env = {**sim.base_env, **extra}
        holder = subprocess.Popen([*prefix, sys.executable, "-c", textwrap.dedent(HOLD), which,
                                   str(lock_dir / "job.lock")], env={**env, "SHAREDFS_NODE_ID": "node-a"},
                                  stdout=subprocess.PIPE, text=True)
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        holder.send_signal(signal.SIGKILL)  # Slurm preemption, OOM killer, time limit
        holder.wait()
        taker = run_py(TAKE, which, str(lock_dir / "job.lock"), env={**env, "SHAREDFS_NODE_ID": "node-b"})
        if taker.returncode:
            outcomes.append(Outcome(True, f"rerun waits forever: {last_error(taker)[:110]}"))
        else:
            outcomes.append(Outcome(False, f"rerun took the lock after {taker.stdout.strip()} s (2 s lease)"))
    return outcomes[0], outcomes[1]


#: How long the live holder keeps its lock, and how long the waiter's first attempt waits.
LIVE_HOLD_SECONDS, LIVE_FIRST_WAIT = 3.0, 1.0

LIVE_HOLDER = """
    import os, sys, time
    which, lock_file, held, hold, trying = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5]
    if which == "filelock":
        import filelock
        lock = filelock.SoftFileLock(lock_file)
    else:
        import sharedfs
        lock = sharedfs.lock(lock_file)
    lock.acquire()
    open(held, "w").close()
    # Held for `hold` s from the waiter's first attempt, not from now: on a busy machine the waiter's
    # interpreter may take longer than that to start, and would find the lock already released.
    deadline = time.monotonic() + 120
    while not os.path.exists(trying) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(hold)
    # Written before the release: a waiter that really waited took the lock after this moment.
    print(time.time(), flush=True)
    lock.release()
"""
LIVE_WAITER = """
    import json, sys, time
    which, lock_file, first_wait, trying = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    if which == "filelock":
        import filelock
        lock, Timeout = filelock.SoftFileLock(lock_file), filelock.Timeout
    else:
        import sharedfs
        lock, Timeout = sharedfs.lock(lock_file), sharedfs.LockTimeout
    out = {"first_attempt": None}
    open(trying, "w").close()  # the holder holds on from here
    try:
        lock.acquire(timeout=first_wait)  # what a user sees while the holder works on
    except Timeout as exc:
        out["first_attempt"] = f"{type(exc).__name__}: {exc}"
        lock.acquire(timeout=60)
    out["acquired_at"] = time.time()
    print(json.dumps(out), flush=True)
"""


#: Another PID namespace on this machine whose processes get pids far above this namespace's: a pid
#: recorded there names no process here, as a pid recorded on another node (or in another container
#: of one pod) does.  The shell forks the program, so it gets the high pid (pid 1 is the shell).
OTHER_PID_SPACE = ('echo $(( $(cat /proc/sys/kernel/pid_max) - 100 )) > /proc/sys/kernel/ns_last_pid 2>/dev/null; '
                   '"$0" "$@" & wait $!')


def _live_run(sim: Sim, which: str, prefix: list[str], overlay: Path) -> Outcome:
    lock_dir = sim.work / f"live-{which}"
    lock_dir.mkdir()
    lock_file, held, trying = lock_dir / "train.lock", lock_dir / "held", lock_dir / "trying"
    # The same filelock on both sides (the one cluster images pin), so sharedfs is the only difference;
    # an existence lock, as on Lustre without flock (forced: the demo's work dir is local disk).
    env = {**sim.base_env, "PYTHONPATH": str(overlay), "SHAREDFS_LOCK": "soft"}
    if which == "filelock":
        env["SHAREDFS_DISABLE"] = "1"
    holder = subprocess.Popen([*prefix, sys.executable, "-c", textwrap.dedent(LIVE_HOLDER), which, str(lock_file),
                               str(held), str(LIVE_HOLD_SECONDS), str(trying)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not held.exists():
            if holder.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the holder did not take the lock: {holder.communicate()[1][-300:]}")
            time.sleep(0.02)
        waiter = run_py(LIVE_WAITER, which, str(lock_file), str(LIVE_FIRST_WAIT), str(trying), env=env, timeout=90)
        released = float(holder.communicate(timeout=60)[0].strip() or "inf")
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    if waiter.returncode:
        return Outcome(True, f"waiter: {last_error(waiter)}")
    result = json.loads(waiter.stdout.strip().splitlines()[-1])
    if result["acquired_at"] < released:
        early = released - result["acquired_at"]
        return Outcome(True, f"BROKE the live holder's lock: the holder's pid does not exist here, so it was "
                             f"taken for dead; both held the lock for {early:.1f} s")
    first = (result["first_attempt"] or "").replace(f"{lock_dir}/", "")
    waited = f"waited for the live holder and took the lock when it released it ({LIVE_HOLD_SECONDS:g} s)"
    if "held by pid" not in first:
        return Outcome(True, f"{waited}, without a word about who holds it ({first[:80]})")
    holder_text = first.split("held by ", 1)[1].split(". ", 1)[0]
    return Outcome(False, f"{waited}; meanwhile it named the holder: {holder_text}")


def live_lock(sim: Sim) -> tuple[Outcome, Outcome]:
    """A holds an existence lock and works on; B, with the same host name but another PID space, wants it.

    Two containers of one pod (or nodes whose containers share a host name) look like one host,
    but a pid from one means nothing in the other.  :data:`OLD_FILELOCK`'s rule -- same host name,
    pid not running here, so dead -- breaks the live holder's lock; sharedfs's rule also needs the
    same boot and PID namespace before a pid may prove anything, so B waits and names A.
    """
    overlay = fetch_old_filelock(sim)
    prefix = [*_unshare("--pid", "--fork", "--mount-proc"), "sh", "-c", OTHER_PID_SPACE]
    return _live_run(sim, "filelock", prefix, overlay), _live_run(sim, "sharedfs", prefix, overlay)

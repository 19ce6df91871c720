"""Never two holders: run-time fallbacks, forks, threads, node identity and broken records.

Each test runs the stock library (filelock) through the same steps as the baseline, shows the
failure the check exists for, and then sharedfs holding the line -- with real processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import filelock
import pytest
from helpers import HELPERS, clean_env

import sharedfs

WORKER = str(HELPERS / "mxworker.py")
#: filelock >= 4 resets a forked child's locks; earlier releases leave the child "holding" them.
FILELOCK_HANDLES_FORK = hasattr(filelock.BaseFileLock, "_reset_after_fork_in_child")


class Client:
    """A lock client process (tests/helpers/mxworker.py)."""

    def __init__(self, lock_file: Path, kind: str, action: str, *args: str, env: dict | None = None) -> None:
        self.proc = subprocess.Popen([sys.executable, WORKER, str(lock_file), kind, action, *args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=clean_env(env or {}))

    def line(self) -> list[str]:
        text = self.proc.stdout.readline()
        assert text, self.proc.stderr.read()
        return text.split()

    def release(self) -> list[str]:
        self.proc.stdin.close()
        out = self.line()
        self.proc.wait(timeout=30)
        return out

    def finish(self) -> list[str]:
        out = self.line()
        self.proc.wait(timeout=30)
        return out


def _try(lock_file: Path, kind: str, timeout: float, env: dict | None = None) -> list[str]:
    return Client(lock_file, kind, "try", str(timeout), env=env).finish()


# -- 2. a native lock refused in one process only -------------------------------------------------


def test_a_native_lock_refused_in_one_process_only_never_makes_two_holders(tmp_path: Path, fault_preload) -> None:
    """Process A holds flock; B's flock fails with ENOLCK (its node's lockd died) and B falls back.

    The stock library fails loudly there ("No locks available"); a fallback that switched only B
    to an existence lock would let B in beside A.  sharedfs's native locks on shared filesystems
    also hold the existence marker, so B's fallback waits for A.
    """
    lock_file = tmp_path / "x.lock"
    nfs = {"MX_NFS_MOUNT": str(tmp_path)}
    broken = fault_preload([str(tmp_path)], "ENOLCK", base={**clean_env(), **nfs})

    stock_holder = Client(lock_file, "stock-flock", "hold", env=nfs)
    assert stock_holder.line()[0] == "held"
    stock = _try(lock_file, "stock-flock", 1, env=broken)
    stock_holder.release()
    # Baseline: never two holders -- filelock >= 3.20 raises "No locks available", older releases
    # mistake ENOLCK for contention and time out.
    assert stock[0] == "timeout", stock

    holder = Client(lock_file, "auto", "hold", env=nfs)
    held = holder.line()
    assert held[0] == "held" and held[2] == "flock"
    waiting = Client(lock_file, "auto", "try", "30", env=broken)
    time.sleep(1.5)
    released = float(holder.release()[1])
    got = waiting.finish()
    assert got[0] == "got", got
    assert float(got[2]) >= released  # B entered only after A let go (1.5 s of A's hold overlapped none)
    assert not (tmp_path / "x.lock.held").exists()


def test_without_the_marker_the_same_fallback_splits_the_lock(tmp_path: Path, fault_preload) -> None:
    """The failure the marker prevents, reproduced: a site plugin that chooses flock without it."""
    lock_file = tmp_path / "x.lock"
    env = {"MX_NFS_MOUNT": str(tmp_path), "MX_NO_MARKER": "1"}
    broken = fault_preload([str(tmp_path)], "ENOLCK", base={**clean_env(), **env})
    holder = Client(lock_file, "auto", "hold", env=env)
    assert holder.line()[0] == "held"
    try:
        second = _try(lock_file, "auto", 5, env=broken)
    finally:
        holder.release()
    assert second[0] == "got"  # two holders at once: what sharedfs 0.1 did


# -- 3. fork after acquire -------------------------------------------------------------------------

FORK = """
import json, os, sys, time, filelock, sharedfs
kind, path = sys.argv[1], sys.argv[2]
lock = filelock.SoftFileLock(path + ".held") if kind == "stock-soft" else sharedfs.lock(path, kind=kind)
with lock:
    pid = os.fork()
    if pid == 0:  # the child leaves the with-block too, as any forked worker would
        child = lock.is_locked
        lock.release()
        os._exit(0 if not child else 3)
    _, status = os.waitpid(pid, 0)
    marker = os.path.exists(path + ".held")
    print(json.dumps({"child_believed_it_held": os.waitstatus_to_exitcode(status) == 3,
                      "parent_holds": lock.is_locked, "marker_after_child": marker}), flush=True)
    sys.stdin.read()
"""


@pytest.mark.parametrize("kind", ["stock-soft", "soft", "lease", "flock"])
def test_a_forked_child_neither_releases_nor_holds_its_parents_lock(tmp_path: Path, kind: str,
                                                                   fault_preload) -> None:
    lock_file = tmp_path / "f.lock"
    env = {"MX_NFS_MOUNT": str(tmp_path)} if kind == "flock" else {}
    proc = subprocess.Popen([sys.executable, "-c", FORK, kind, str(lock_file)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(env))
    try:
        state = json.loads(proc.stdout.readline() or "null") or pytest.fail(proc.stderr.read())
        right = {"child_believed_it_held": False, "parent_holds": True,
                 "marker_after_child": kind != "flock" or os.path.exists(f"{lock_file}.held")}
        if kind == "stock-soft" and not FILELOCK_HANDLES_FORK:
            # filelock < 4 (what Python 3.9 gets): the child believes it holds its parent's lock and
            # its release deletes the parent's marker -- the failure sharedfs must not repeat.
            right = {**right, "child_believed_it_held": True, "marker_after_child": False}
        assert state == right
        if kind != "stock-soft":
            other = _try(lock_file, kind, 0.5)
            assert other[0] == "timeout"  # the parent still excludes everyone
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


CHILD_RETAKES = """
import os, sys, sharedfs
path = sys.argv[1]
with sharedfs.lock(path, kind="posix"):  # the parent has held (and released) a lock before forking
    pass
pid = os.fork()
if pid == 0:
    lock = sharedfs.lock(path, kind="posix", timeout=0)
    try:
        for _ in range(2):  # the second take needs the first release to have let go of everything
            lock.acquire()
            lock.release()
    except sharedfs.LockTimeout:
        os._exit(3)
    os._exit(0)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
"""


def test_a_forked_child_releases_the_locks_it_takes_itself(tmp_path: Path) -> None:
    # A release skips the unlock when the hold was taken by another process (the parent of a fork).
    # A hold records its taker's pid from a value kept current across forks (no system call per
    # take): had the child kept its parent's, its own release would take the hold for its parent's,
    # leave the posix lock's in-process guard taken, and its next take would time out.
    out = subprocess.run([sys.executable, "-c", CHILD_RETAKES, str(tmp_path / "c.lock")], capture_output=True,
                         text=True, env=clean_env(), timeout=60)
    assert out.stdout.strip() == "0", out.stderr


def test_a_threads_wait_ends_with_its_acquire_timed_out_or_not(tmp_path: Path, fresh_runtime) -> None:
    # Uncontended attempts skip the thread-local wait state while no thread of the process waits
    # (a count of waiting threads): the count must come back to 0 however a wait ends.
    holder = sharedfs.lock(tmp_path / "w.lock", kind="soft")
    lock = sharedfs.lock(tmp_path / "w.lock", kind="soft", poll_interval=0.01)
    state = lock._sharedfs()
    holder.acquire()
    with pytest.raises(sharedfs.LockTimeout):
        lock.acquire(timeout=0.1)
    assert state.waiting == 0 and not state.waits.missed
    waiting: list[int] = []
    taker = threading.Thread(target=lambda: (lock.acquire(timeout=10), lock.release()))
    taker.start()
    deadline = time.monotonic() + 5
    while not state.waiting and time.monotonic() < deadline:
        time.sleep(0.005)
    waiting.append(state.waiting)
    holder.release()
    taker.join(10)
    assert waiting == [1] and state.waiting == 0
    with lock:  # and an uncontended take after all that
        assert lock.is_locked


# -- 4. threads sharing one lock object -------------------------------------------------------------


def _count_with_threads(lock: object, counter: Path, threads: int = 4, rounds: int = 50) -> int:
    def work() -> None:
        for _ in range(rounds):
            with lock:  # type: ignore[attr-defined]
                value = int(counter.read_text() or 0)
                time.sleep(0.0005)
                counter.write_text(str(value + 1))

    counter.write_text("0")
    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return int(counter.read_text())


@pytest.mark.parametrize("kind", ["flock", "posix", "soft", "lease"])
def test_threads_sharing_one_lock_object_take_turns(tmp_path: Path, kind: str, fresh_runtime) -> None:
    counter = tmp_path / "counter"
    # The stock library's default (thread_local=True) makes threads take turns; its opt-out shows
    # what the count looks like when they do not: wrong, lower (lost updates) or higher (two
    # writers' digits overlap in the file: "99" written over "100" leaves "990").
    assert _count_with_threads(filelock.FileLock(tmp_path / "stock.lock"), counter) == 200
    assert _count_with_threads(filelock.FileLock(tmp_path / "shared.lock", thread_local=False), counter) != 200
    assert _count_with_threads(sharedfs.lock(tmp_path / "s.lock", kind=kind), counter) == 200


# -- 5. broken, hostile or huge holder records ---------------------------------------------------------


def _plant(marker: Path, what: str, tmp_path: Path) -> None:
    if what == "fifo":
        os.mkfifo(marker)
    elif what == "symlink-to-dev-zero":
        marker.symlink_to("/dev/zero")
    elif what == "huge":
        with open(marker, "wb") as fh:
            fh.truncate(400 * 1024 * 1024)  # sparse: 400 MB to read, nothing on disk
    elif what == "directory":
        marker.mkdir()
    else:
        marker.write_text(what)


RECORDS = {
    "json-list": "[1, 2, 3]",
    "pid-string": json.dumps({"node": "n", "pid": "12", "acquired_at": 1.0, "kind": "soft"}),
    "pid-float": json.dumps({"node": "n", "pid": 1.5, "acquired_at": 1.0, "kind": "soft"}),
    "pid-null": json.dumps({"node": "n", "pid": None, "acquired_at": 1.0, "kind": "soft"}),
    "pid-2**64": json.dumps({"node": "n", "pid": 2**64, "acquired_at": 1.0, "kind": "soft"}),
    "acquired_at-string": json.dumps({"node": "n", "pid": 1, "acquired_at": "noon", "kind": "soft"}),
    "binary": "\x00\xff\xfe garbage",
    "fifo": "fifo",
    "symlink-to-dev-zero": "symlink-to-dev-zero",
    "huge": "huge",
    "directory": "directory",
}

TRY_ONCE = """
import sys, time, filelock, sharedfs
kind, path, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
lock = filelock.SoftFileLock(path + ".held") if kind == "stock-soft" else sharedfs.lock(path, kind=kind)
start = time.monotonic()
try:
    lock.acquire(timeout=timeout)
    outcome = "acquired"
except filelock.Timeout:
    outcome = "timeout"
# VmHWM, not ru_maxrss: the latter keeps the peak of the forked parent (pytest) across exec.
peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(outcome, round(time.monotonic() - start, 2), peak // 1024)
"""


@pytest.mark.parametrize("what", list(RECORDS))
def test_a_broken_holder_record_means_cannot_tell_never_a_crash_or_hang(tmp_path: Path, what: str) -> None:
    lock_file = tmp_path / "r.lock"
    _plant(Path(f"{lock_file}.held"), RECORDS[what], tmp_path)
    results = {}
    for kind in ("stock-soft", "soft", "lease"):
        proc = subprocess.run([sys.executable, "-c", TRY_ONCE, kind, str(lock_file), "1.0"], capture_output=True,
                              text=True, env=clean_env({"SHAREDFS_NODE_ID": "n"}), timeout=30)
        if proc.returncode != 0:
            results[kind] = proc.stderr.strip().splitlines()[-1].split(":")[0]
            continue
        outcome, seconds, rss_mb = proc.stdout.split()
        results[kind] = outcome
        assert float(seconds) < 2.0, f"{kind} overran its 1 s timeout: {seconds} s"
        if kind != "stock-soft":
            assert int(rss_mb) < 200, f"{kind} read the whole file: {rss_mb} MB"
    # The stock library times out cleanly (a directory there makes it raise IsADirectoryError);
    # sharedfs always times out cleanly, and says once what it found.
    stock = "IsADirectoryError" if what == "directory" else "timeout"
    assert results == {"stock-soft": stock, "soft": "timeout", "lease": "timeout"}


# -- 1. node identity: a pid is evidence only in its own kernel boot and PID namespace -----------------


def _foreign_record(node: str, pidns: str | None) -> dict:
    from sharedfs.model.records import HolderRecord

    record = HolderRecord.mine(node, "soft")
    dead_pid = 4 * 1024 * 1024 - 7  # above any pid this machine has handed out
    return {**record.__dict__, "pid": dead_pid, "start_time": None,
            **({"pidns": pidns} if pidns is not None else {})}


@pytest.mark.parametrize(("case", "env", "broken"), [
    ("same node, boot and namespace: the pid is gone", {}, True),
    ("another PID namespace (a Slurm task, a container)", {"pidns": "4026531999"}, False),
    ("a node id that contradicts the scheduler", {"SLURMD_NODENAME": "n2"}, False),
    ("another node", {"SHAREDFS_NODE_ID": "n9"}, False),
])
def test_a_holder_is_declared_dead_on_local_evidence_only_when_unambiguous(tmp_path: Path, case: str, env: dict,
                                                                        broken: bool) -> None:
    lock_file = tmp_path / "n.lock"
    record = _foreign_record("n1", env.get("pidns"))
    Path(f"{lock_file}.held").write_text(json.dumps(record))
    proc_env = {"SHAREDFS_NODE_ID": "n1", **{k: v for k, v in env.items() if k != "pidns"}}
    if "SHAREDFS_NODE_ID" in env:  # the record is another node's
        Path(f"{lock_file}.held").write_text(json.dumps({**record, "node": "n1"}))
    outcome = _try(lock_file, "soft", 1.5, env=proc_env)
    assert (outcome[0] == "got") is broken, (case, outcome)
    if not broken:
        assert "Nobody could tell whether it is still running" in " ".join(outcome)


def test_sharedfs_env_never_exports_a_node_id(tmp_path: Path) -> None:
    """`eval "$(sharedfs env)"` in a batch script, then srun: one node name for every node (issue: live locks broken)."""
    proc = subprocess.run([sys.executable, "-m", "sharedfs", "env", "--json"], capture_output=True, text=True,
                          env=clean_env({"SLURMD_NODENAME": "n1", "SLURM_JOB_ID": "7", "SHAREDFS_CACHE": "node-local",
                                         "SHAREDFS_CACHE_ROOT": str(tmp_path)}))
    assert proc.returncode == 0, proc.stderr
    exports = json.loads(proc.stdout)
    assert "SHAREDFS_NODE_ID" not in exports and exports["SHAREDFS_CACHE"] == "node-local"

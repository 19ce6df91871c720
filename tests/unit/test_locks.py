"""sharedfs.lock on local disk: every kind excludes across real processes; stale holders are handled."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import filelock
import pytest
from helpers import clean_env
from helpers.locktools import run_workers

import sharedfs
import sharedfs.types

HOLD = """
import sys, time, sharedfs
lock = sharedfs.lock(sys.argv[1], kind=sys.argv[2])
lock.acquire()
print("held", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("kind", ["flock", "posix", "soft", "lease"])
def test_every_kind_excludes_across_processes(tmp_path: Path, kind: str) -> None:
    work = tmp_path / "work"
    work.mkdir()
    value, overlaps, kinds = run_workers(work, {"n1": 4}, 15, env={"SHAREDFS_LOCK": kind})
    assert (value, overlaps, kinds) == (60, 0, {kind})


def test_lock_is_reentrant_and_reports_its_kind(tmp_path: Path, fresh_runtime) -> None:
    lock = sharedfs.lock(tmp_path / "a.lock", kind="soft")
    with lock, lock:
        # One file: the marker holds the holder's record (no separate record file to plant a symlink at).
        assert lock.is_locked and f'"pid":{os.getpid()}' in (tmp_path / "a.lock.held").read_text()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["a.lock.held"]
    assert not lock.is_locked and not (tmp_path / "a.lock.held").exists()


def test_posix_lock_excludes_threads_of_one_process(tmp_path: Path, fresh_runtime) -> None:
    first = sharedfs.lock(tmp_path / "p.lock", kind="posix")
    second = sharedfs.lock(tmp_path / "p.lock", kind="posix", timeout=0)
    with first:
        with pytest.raises(sharedfs.LockTimeout):
            second.acquire()
    with second:
        assert second.is_locked


def _hold(lock_file: Path, kind: str, node: str, **env: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(lock_file), kind], stdout=subprocess.PIPE, text=True,
                            env=clean_env({"SHAREDFS_NODE_ID": node, **env}))
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_soft_lock_of_a_killed_holder_on_this_node_is_recovered_at_once(tmp_path: Path, fresh_runtime,
                                                                         monkeypatch) -> None:
    monkeypatch.setenv("SHAREDFS_NODE_ID", "nodeA")
    holder = _hold(tmp_path / "s.lock", "soft", "nodeA")
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert (tmp_path / "s.lock.held").exists()  # the marker outlived its holder
    started = time.monotonic()
    with sharedfs.lock(tmp_path / "s.lock", kind="soft", timeout=10):
        waited = time.monotonic() - started
    assert waited < 1.0


def test_waiting_for_a_live_holder_on_another_node_names_it_and_how_to_clear(tmp_path: Path, fresh_runtime,
                                                                             monkeypatch) -> None:
    monkeypatch.setenv("SHAREDFS_NODE_ID", "nodeB")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    holder = _hold(tmp_path / "s.lock", "soft", "nodeA", SLURM_JOB_ID="777", SLURM_STEP_ID="0")
    try:
        with pytest.raises(sharedfs.LockTimeout) as info:
            sharedfs.lock(tmp_path / "s.lock", kind="soft", timeout=0.3).acquire()
        message = str(info.value)
        # The step comes only from the slurmstepd a holder runs under (SLURM_STEP_ID is inherited by
        # batch scripts from whoever ran sbatch); outside one, the record names the job alone.
        assert f"pid {holder.pid} on node nodeA, Slurm job 777, held for" in message
        assert f"rm -f {tmp_path}/s.lock.held" in message
        # ... and the command that tells a live holder from a dead one before anything is removed.
        assert f"sharedfs locks --clear-dead {tmp_path}/s.lock" in message
        assert f"sharedfs locks {tmp_path}/s.lock" in message
        assert "within 0.3 s" in message and "SHAREDFS_WAIT_TIMEOUT" in message
    finally:
        holder.kill()
        holder.wait()


def test_a_stuck_lease_holder_on_another_node_is_taken_over_after_the_lease(tmp_path: Path, fresh_runtime,
                                                                            monkeypatch) -> None:
    monkeypatch.setenv("SHAREDFS_NODE_ID", "nodeB")
    monkeypatch.setenv("SHAREDFS_LEASE_SECONDS", "1.5")
    holder = _hold(tmp_path / "l.lock", "lease", "nodeA", SHAREDFS_LEASE_SECONDS="1.5")
    holder.send_signal(signal.SIGSTOP)  # alive, but its heartbeat no longer runs
    try:
        started = time.monotonic()
        with sharedfs.lock(tmp_path / "l.lock", kind="lease", timeout=20) as lock:
            waited = time.monotonic() - started
            assert lock.kind == "lease"
        assert 1.0 <= waited < 6.0, waited
    finally:
        holder.kill()
        holder.wait()



class _VouchesForEveryone:
    """A site plugin that knows better than the lease: every holder is alive (say, a heartbeat service)."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    @sharedfs.types.hookimpl(tryfirst=True)
    def sharedfs_holder_alive(self, record):  # type: ignore[no-untyped-def]  # a plugin may name fewer arguments
        self.asked.append(record.kind)
        return True


def test_a_lease_is_judged_through_the_liveness_hook_so_a_site_plugin_can_keep_it(tmp_path: Path, fresh_runtime,
                                                                                  monkeypatch) -> None:
    # The lease's expiry is plugins/liveness.py's answer to sharedfs_holder_alive, not a rule of the lock's
    # own: a site plugin that answers first keeps a stuck holder's lock, and without it the lease decides.
    monkeypatch.setenv("SHAREDFS_NODE_ID", "nodeB")
    monkeypatch.setenv("SHAREDFS_LEASE_SECONDS", "1")
    holder = _hold(tmp_path / "l.lock", "lease", "nodeA", SHAREDFS_LEASE_SECONDS="1")
    holder.send_signal(signal.SIGSTOP)  # alive, but its heartbeat no longer runs
    site = _VouchesForEveryone()
    pm = fresh_runtime.registry().pm
    pm.register(site, name="test-site-heartbeat")
    try:
        with pytest.raises(sharedfs.LockTimeout):
            sharedfs.lock(tmp_path / "l.lock", kind="lease", timeout=2.5).acquire()
        assert site.asked and set(site.asked) == {"lease"}
        pm.unregister(name="test-site-heartbeat")
        with sharedfs.lock(tmp_path / "l.lock", kind="lease", timeout=20) as lock:
            assert lock.kind == "lease"
    finally:
        holder.kill()
        holder.wait()


def test_the_liveness_plugin_judges_a_lease_by_how_long_its_waiter_saw_it_unchanged() -> None:
    from sharedfs.model.policy import resolve
    from sharedfs.model.records import HolderRecord
    from sharedfs.plugins import liveness

    policy = resolve([])
    record = HolderRecord.mine("elsewhere", "lease", lease_seconds=2.0)
    assert liveness.sharedfs_holder_alive(record, policy, unchanged_for=1.9) is True
    assert liveness.sharedfs_holder_alive(record, policy, unchanged_for=2.0) is False
    # Not watched (job cleanup, the shard cache): the lease says nothing; another node's pid cannot either.
    assert liveness.sharedfs_holder_alive(record, policy, unchanged_for=None) is None



def test_a_shard_cache_record_nobody_can_vouch_for_is_gone_after_its_lifetime_but_a_lock_holder_never() -> None:
    # The shard cache's six hours are the liveness plugin's last answer to the one hook, asked after the
    # scheduler; a lock's holder record of the same age from another node stays "cannot tell".
    from sharedfs.machinery.registry import Registry
    from sharedfs.model.policy import resolve
    from sharedfs.model.records import HolderRecord
    from sharedfs.plugins import liveness

    policy = resolve([])
    registry = Registry(entry_points=False)
    day_old = {"node": "elsewhere", "acquired_at": 0.0}
    for kind in sorted(liveness.SHARD_RECORD_KINDS):
        old = dataclasses.replace(HolderRecord.mine("elsewhere", kind), **day_old)
        fresh = HolderRecord.mine("elsewhere", kind)
        assert registry.holder_alive(old, policy) is False, kind
        assert registry.holder_alive(fresh, policy) is None, kind
    for kind in ("soft", "flock", "posix", "user"):
        assert registry.holder_alive(dataclasses.replace(HolderRecord.mine("elsewhere", kind), **day_old), policy) is None, kind


def test_auto_chooses_flock_on_local_disk(tmp_path: Path, fresh_runtime) -> None:
    lock = sharedfs.lock(tmp_path / "x.lock")
    assert lock.kind == "flock" and "local" in lock.choice.reason


def test_an_existence_lock_is_not_blocked_by_a_leftover_native_lock_file(tmp_path: Path, fresh_runtime) -> None:
    (tmp_path / "d.lock").write_text("")  # left by filelock.FileLock, which never deletes its file
    with sharedfs.lock(tmp_path / "d.lock", kind="soft", timeout=1) as lock:
        assert lock.marker == f"{tmp_path}/d.lock.held"


def _wait_across_a_retargeted_symlink(make, tmp_path: Path) -> str:
    """Hold a/x.lock; wait on link/x.lock (link -> a) while link is retargeted to b: "timeout" or "acquired"."""
    tmp_path.mkdir()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "a")

    def retarget() -> None:
        (tmp_path / "new").symlink_to(tmp_path / "b")
        os.replace(tmp_path / "new", link)

    holder = make(str(tmp_path / "a" / "x.lock"))
    waiter = make(str(link / "x.lock"))
    with holder:
        timer = threading.Timer(0.3, retarget)
        timer.start()
        try:
            waiter.acquire(timeout=1.5, poll_interval=0.02)
        except filelock.Timeout:
            return "timeout"
        finally:
            timer.join()
        waiter.release()
        return "acquired"


def test_a_wait_keeps_the_lock_file_its_acquire_began_with(tmp_path: Path, fresh_runtime) -> None:
    # filelock >= 4.2.12 resolves the lock file's directory when an acquire begins and waits for
    # that file (its claim_root): a symlink retargeted meanwhile cannot send the waiter to another
    # file.  sharedfs opened the path again at every attempt and took b/x.lock while a/x.lock was
    # held.  Older filelock follows the symlink at each attempt, and so does sharedfs with it.
    stock = _wait_across_a_retargeted_symlink(filelock.FileLock, tmp_path / "stock")
    ours = _wait_across_a_retargeted_symlink(sharedfs.lock, tmp_path / "sharedfs")
    assert ours == stock
    if hasattr(filelock.BaseFileLock, "_pin_lock_path"):
        assert stock == "timeout"


FALLBACK = """
import sys, sharedfs
first = sharedfs.lock(sys.argv[1] + "/a.lock")
with first:
    print(first.kind)
print(sharedfs.lock(sys.argv[1] + "/b.lock").kind)
"""


@pytest.mark.parametrize("errno_name", ["ENOSYS", "ENOLCK"])
def test_a_native_lock_refused_at_run_time_falls_back_for_the_whole_mount(tmp_path: Path, errno_name: str) -> None:
    # The classification says "local ext4, flock works"; the kernel says otherwise (a
    # mislabelled mount, or lockd died): the job must go on, and say what happened.
    from sharedfs.demo.preload import preload_env

    env = preload_env([str(tmp_path)], errno_name, base=clean_env())
    proc = subprocess.run([sys.executable, "-c", FALLBACK, str(tmp_path)], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["soft", "soft"]
    assert f"flock failed with {errno_name} at {tmp_path}/a.lock; sharedfs switched this filesystem" in proc.stderr

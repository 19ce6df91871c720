"""The chaos drill: six workers, and every ~0.3 s a random one is SIGKILLed, for each lock kind and hostile profile.

Never two holders: no lost update (the counter never falls behind the committed increments), no
overlapping hold intervals, and the lock is taken over soon after a holder dies (the kernel drops
a dead flock holder's lock; an existence lock's dead holder is recognised by its record on this
node; a lease expires).  The same drill with stock ``filelock.FileLock`` on flock that excludes one
node only (the ``localflock`` profile, workers on two simulated nodes) shows what the checks catch.
"""

from __future__ import annotations

import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import HELPERS, clean_env
from helpers.locktools import count_overlaps

WORKER = str(HELPERS / "chaosworker.py")
WORKERS = 6
SECONDS = 15.0
KILL_EVERY = 0.3


def drill(directory: Path, log: Path, kind: str, env: dict[str, str], nodes: int = 1) -> dict[str, float]:
    lock_file, counter = directory / "drill.lock", directory / "counter"

    def start(index: int) -> subprocess.Popen:
        node_env = {**env, "SHAREDFS_NODE_ID": f"n{index % nodes + 1}"}
        return subprocess.Popen([sys.executable, WORKER, str(lock_file), str(counter), str(log), kind],
                                env=clean_env(node_env), stderr=subprocess.DEVNULL)

    procs = [start(index) for index in range(WORKERS)]
    kills: list[float] = []
    rng = random.Random(1234)
    deadline = time.monotonic() + SECONDS
    try:
        while time.monotonic() < deadline:
            time.sleep(KILL_EVERY)
            victim = rng.randrange(WORKERS)
            if not Path(f"{log}.ready-{procs[victim].pid}").exists():
                continue  # still starting (a busy machine): killing it would only starve the drill
            procs[victim].send_signal(signal.SIGKILL)
            procs[victim].wait()
            kills.append(time.monotonic())
            procs[victim] = start(victim)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    lines = [line.split() for line in log.read_text().splitlines() if len(line.split()) == 4]
    intervals = sorted((float(start), float(end)) for _, start, end, _ in lines)
    value = int(counter.read_text())
    # After each kill, how long until the next hold began (a dead holder's lock taken over).
    starts = [s for s, _ in intervals]
    takeover = [min((s - k for s in starts if s > k), default=SECONDS) for k in kills]
    return {"committed": len(lines), "counter": value, "kills": len(kills), "overlaps": count_overlaps(intervals),
            "takeover_median": statistics.median(takeover), "holds": len(intervals)}


@pytest.mark.parametrize("kind", ["flock", "soft", "lease"])
def test_chaos_drill_on_local_disk(tmp_path: Path, kind: str) -> None:
    work = tmp_path / "work"
    work.mkdir()
    result = drill(work, tmp_path / "drill.log", kind, {"SHAREDFS_LEASE_SECONDS": "1"})
    print(kind, result)
    assert result["overlaps"] == 0, result
    assert result["committed"] <= result["counter"] <= result["committed"] + result["kills"], result  # no lost update
    assert result["holds"] > 50, result  # the drill kept making progress through the kills
    assert result["takeover_median"] < (2.0 if kind == "lease" else 0.5), result


def test_the_drill_catches_two_holders(tmp_path: Path, hostile_mount) -> None:
    mount = hostile_mount("localflock")
    work = mount.path / "stock"
    work.mkdir()
    result = drill(work, tmp_path / "stock.log", "stock-flock", {}, nodes=2)
    print("stock FileLock on localflock", result)
    assert result["overlaps"] > 0 or result["counter"] < result["committed"], result


@pytest.mark.parametrize("profile", ["lustre-noflock", "nfs-nolock", "localflock"])
def test_chaos_drill_on_hostile_filesystems(tmp_path: Path, hostile_mount, profile: str) -> None:
    mount = hostile_mount(profile)
    work = mount.path / "work"
    work.mkdir()
    result = drill(work, tmp_path / "drill.log", "auto", {}, nodes=2)
    print(profile, result)
    assert result["overlaps"] == 0, result
    assert result["committed"] <= result["counter"] <= result["committed"] + result["kills"], result
    assert result["holds"] > 20, result
    assert result["takeover_median"] < 1.0, result

"""Waiting costs the shared filesystem O(nodes), not O(ranks): counted on hostilefs.

Two simulated nodes wait for a lock (or a directory) that a third node holds (or has not made
yet) for a few seconds.  The counting hostilefs says how many operations each waiting node
sent per second, with 2 and with 8 waiting ranks per node.  Stock ``filelock.SoftFileLock`` and
a plain ``os.path.exists`` loop grow with the ranks (asserted first: the failure); sharedfs's
node gates keep one representative per node, so it stays flat.  The lock holder's record names
a Slurm job, so sharedfs's waiters also ask a counting fake ``squeue``: at most one call per
node per 2 s.  benchmarks/scale.py measures the same at 4 and 8 nodes x 4..16 ranks.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Callable, Iterator, NamedTuple

import pytest
from harness.skips import skip_or_fail

from sharedfs.demo.hostilefs import FuseUnavailable, HostileMount, fuse_available, metadata_ops, mount
from sharedfs.demo.nodes import node_env

# xdist_group: the module's counting FUSE mount, mounted once.
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="FUSE is Linux-only"),
              pytest.mark.xdist_group("test_scale")]

#: SHAREDFS_POLL_INTERVAL, and the baselines' polling interval: equal pace per process.
POLL = 0.5
#: Seconds of waiting before counting (first attempts, backing off to POLL), then counted.
WARMUP, WINDOW = 1.0, 4.0
NODES = ("a", "b")

WAITER = textwrap.dedent("""
    import os, sys, time
    how, target, ready, poll = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    if how == "soft":
        import filelock
        lock = filelock.SoftFileLock(target, timeout=120, poll_interval=poll)
    elif how != "exists":
        import sharedfs
        from sharedfs.plugins import slurm
        slurm.SHARED_PARENTS = (os.environ["SHAREDFS_CACHE_ROOT"],)  # this simulated node's /dev/shm
        lock = sharedfs.lock(target, timeout=120)
    open(ready, "w").close()
    if how == "wait_for":
        sharedfs.wait_for(target, timeout=120)
    elif how == "exists":
        while not os.path.exists(target):
            time.sleep(poll)
    else:
        lock.acquire()
    print(time.time(), flush=True)
    if how in ("soft", "sharedfs"):
        lock.release()
""")

HOLDER = textwrap.dedent("""
    import os, sys, time
    how, target, held, release = sys.argv[1:5]
    if how in ("soft", "sharedfs"):
        import filelock, sharedfs
        lock = filelock.SoftFileLock(target) if how == "soft" else sharedfs.lock(target)
        lock.acquire()
    open(held, "w").close()
    while not os.path.exists(release):
        time.sleep(0.005)
    print(time.time(), flush=True)
    if how in ("soft", "sharedfs"):
        lock.release()
    else:
        os.mkdir(target)
""")

SQUEUE = """#!/bin/sh
echo "$SHAREDFS_NODE_ID $(date +%s.%N)" >> "$SQUEUE_LOG"
echo "4242|4242|RUNNING|N/A"
"""


class Waited(NamedTuple):
    ops_per_node: float  # metadata operations per second, mean over the waiting nodes
    squeue_gap: float  # the shortest time between two squeue calls of one node, over the whole wait
    first: float  # seconds from the release to the first waiter through


class Site(NamedTuple):
    root: Path
    mount: HostileMount
    env: dict[str, str]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    ok, reason = fuse_available()
    if not ok:
        skip_or_fail(f"FUSE unavailable: {reason}")
    root = tmp_path_factory.mktemp("scale")
    try:
        counted = mount(root / "backing", root / "mnt", "lustre-noflock", count_ops=True)
    except FuseUnavailable as exc:
        skip_or_fail(f"FUSE unavailable: {exc}")
    (root / "bin").mkdir()
    (root / "bin" / "squeue").write_text(SQUEUE)
    (root / "bin" / "squeue").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHAREDFS_", "SLURM"))}
    env.update(PATH=f"{root / 'bin'}{os.pathsep}{env.get('PATH', '')}", SHAREDFS_POLL_INTERVAL=str(POLL))
    try:
        yield Site(root, counted, env)
    finally:
        counted.unmount()


def _start(site: Site, code: str, node: str, args: list[str], out: Path, **extra: str) -> subprocess.Popen:
    env = node_env(node, site.env, local_root=site.root / "local", **extra)
    with open(out, "wb") as sink, open(out.with_suffix(".err"), "wb") as errors:
        return subprocess.Popen([sys.executable, "-c", code, *args], env=env, stdin=subprocess.DEVNULL,
                                stdout=sink, stderr=errors, cwd=site.root)


def _until(done: Callable[[], bool], procs: list[subprocess.Popen], work: Path, what: str) -> None:
    deadline = time.monotonic() + 60
    while not done():
        failed = sum(p.poll() not in (None, 0) for p in procs)
        if failed or time.monotonic() > deadline:
            errors = "".join(f"{e.name}: {e.read_text()[-2000:]}" for e in sorted(work.glob("*.err")) if e.stat().st_size)
            raise AssertionError(f"{what}: {failed} processes failed, or 60 s passed\n{errors}")
        time.sleep(0.05)


def wait_with(site: Site, how: str, ranks: int) -> Waited:
    """``ranks`` processes on each of NODES wait (``how``) while node "holder" holds; what that cost."""
    work = site.root / f"{how}-{ranks}"
    (work / "ready").mkdir(parents=True)
    target = str(site.mount.path / f"{how}-{ranks}" / ("dir" if how in ("wait_for", "exists") else "x.lock"))
    os.mkdir(os.path.dirname(target))
    log = work / "squeue.log"
    holder = _start(site, HOLDER, "holder", [how, target, str(work / "held"), str(work / "release")],
                    work / "holder.out", SLURM_JOB_ID="4242")
    procs = [holder]
    try:
        _until((work / "held").exists, procs, work, "holder")
        for node in NODES:
            procs += [_start(site, WAITER, node, [how, target, str(work / "ready" / f"{node}{i}"), str(POLL)],
                             work / f"{node}{i}.out", SQUEUE_LOG=str(log)) for i in range(ranks)]
        _until(lambda: len(os.listdir(work / "ready")) == len(NODES) * ranks, procs, work, "waiters starting")
        time.sleep(WARMUP)
        site.mount.op_counts(reset=True)
        time.sleep(WINDOW)
        counts = site.mount.op_counts(reset=True)
        (work / "release").touch()
        _until(lambda: all(p.poll() is not None for p in procs), procs, work, "waiters finishing")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    released = float((work / "holder.out").read_text().split()[0])
    through = min(float((work / f"{n}{i}.out").read_text()) for n in NODES for i in range(ranks))
    per_node = statistics.mean(metadata_ops(counts, node) for node in NODES) / WINDOW
    return Waited(per_node, _shortest_gap(log), through - released)


def _shortest_gap(log: Path) -> float:
    """The shortest time between two squeue calls made from one node (infinite: fewer than two)."""
    calls: dict[str, list[float]] = {}
    for line in log.read_text().splitlines() if log.exists() else []:
        node, at = line.split()
        calls.setdefault(node, []).append(float(at))
    gaps = [b - a for times in calls.values() for a, b in zip(sorted(times), sorted(times)[1:])]
    return min(gaps, default=float("inf"))


def test_the_counter_attributes_each_operation_to_its_simulated_node(site: Site) -> None:
    probe = str(site.mount.path / "nothing-here")
    site.mount.op_counts(reset=True)
    for node, looks in (("a", 5), ("b", 20)):
        subprocess.run([sys.executable, "-c", f"import os\nfor _ in range({looks}): os.path.exists({probe!r})"],
                       env=node_env(node, site.env), check=True)
    counts = site.mount.op_counts(reset=True)
    # Each look is a lookup or two (the kernel revalidates the mount root too: nothing is cached).
    assert set(counts) == {"a", "b"} and set(counts["a"]) == set(counts["b"]) == {"getattr"}, counts
    assert counts["a"]["getattr"] in (5, 10) and counts["b"]["getattr"] == 4 * counts["a"]["getattr"], counts
    assert metadata_ops(counts) == 5 * counts["a"]["getattr"] and site.mount.op_counts() == {}


def test_lock_waiters_cost_the_filesystem_per_node_not_per_rank(site: Site) -> None:
    soft = {ranks: wait_with(site, "soft", ranks) for ranks in (2, 8)}
    ours = {ranks: wait_with(site, "sharedfs", ranks) for ranks in (2, 8)}
    summary = {"soft": soft, "sharedfs": ours}
    # The failure: every waiting rank polls the marker itself.
    assert soft[8].ops_per_node >= 3 * soft[2].ops_per_node, summary
    # Its absence: one representative per node asks, whatever the ranks.
    assert ours[8].ops_per_node <= 1.5 * ours[2].ops_per_node, summary
    assert ours[8].ops_per_node < soft[8].ops_per_node / 3, summary
    # The holder's job is asked about at most once per node per 2 s (slurm.CACHE_SECONDS), from the first attempts on.
    assert all(w.squeue_gap >= 2.0 for w in ours.values()), summary
    assert all(w.first <= 1.5 * POLL + 0.1 for w in ours.values()), summary  # + one filelock poll (0.05 s) and slack


def test_path_waiters_cost_the_filesystem_per_node_not_per_rank(site: Site) -> None:
    loop = {ranks: wait_with(site, "exists", ranks) for ranks in (2, 8)}
    ours = {ranks: wait_with(site, "wait_for", ranks) for ranks in (2, 8)}
    summary = {"exists loop": loop, "wait_for": ours}
    assert loop[8].ops_per_node >= 3 * loop[2].ops_per_node, summary
    assert ours[8].ops_per_node <= 1.5 * ours[2].ops_per_node, summary
    assert all(w.first <= 1.5 * POLL + 0.1 for w in ours.values()), summary

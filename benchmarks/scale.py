"""Waiting at scale: shared-filesystem metadata operations and Slurm queries while many ranks wait.

Simulated nodes (``SHAREDFS_NODE_ID`` plus a node-local ``SHAREDFS_CACHE_ROOT`` each) share one
hostilefs mount that counts every operation per node (``lustre-noflock``: flock fails with
ENOSYS, as on Lustre without ``-o flock``, so locks there are existence locks).  A holder on a
node of its own keeps a lock (or has not made a directory yet) for ``--warmup + --window``
seconds while ``ranks`` processes on each of ``nodes`` nodes wait for it; then it lets go.

* lock: ``sharedfs.lock`` (auto -> soft; its record names Slurm job 4242, so waiters ask a fake
  ``squeue`` on PATH, which counts calls per node and answers RUNNING) against
  ``filelock.SoftFileLock`` polling at the same interval (``SHAREDFS_POLL_INTERVAL``, default
  1 s; stock filelock polls every 0.05 s, 20x more often);
* lock, ungated: sharedfs with node gates and the shared Slurm answer cache switched off in the
  waiters, i.e. every rank asks the filesystem and the scheduler itself (16 ranks per node only);
* wait_for: ``sharedfs.wait_for`` against ``while not os.path.exists(p): sleep(interval)``.

Measured in the steady window (after ``--warmup`` s): metadata operations per second per waiting
node (mean over nodes; ``hostilefs.METADATA_OPS``), ``squeue`` calls per second per node, and
after the release: seconds until the first waiter holds the lock (sees the directory) and until
all of them have.  Goals: ops/s per node flat (<= 1.2x) from 4 to 16 ranks per node; <= 1 squeue
per node per 2 s; first acquisition within 1.5 poll intervals of the release.

Each simulated node's Slurm answer cache lives in its node-local root instead of ``/dev/shm``
(which all simulated nodes of this one machine share).  Needs FUSE (see ``sharedfs.demo``).

    python benchmarks/scale.py [--json] [--nodes 4 8] [--ranks 4 8 16] [--rounds 1] [--window 8]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

#: benchmarks/run_all.py: this takes 5 to 9 minutes (22 runs of about 20 s; longer on a loaded machine).
RUN_ALL_TIMEOUT = 1500
JOB = "4242"
HOLDER_NODE = "holder"
#: Lock flavours and path-wait flavours; each pair is measured side by side.
LOCKS = ("sharedfs", "soft")
WAITS = ("wait_for", "exists")

WAITER = textwrap.dedent("""
    import json, os, sys, time
    how, target, ready, poll = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    if how in ("sharedfs", "ungated", "wait_for"):
        import sharedfs
        from sharedfs.plugins import slurm
        # This simulated node's /dev/shm: its ranks, and only they, share Slurm's answers.
        slurm.SHARED_PARENTS = (os.environ["SHAREDFS_CACHE_ROOT"],)
        if how == "ungated":  # every rank asks the filesystem and the scheduler itself
            from sharedfs.cluster import gates
            gates.try_enter = lambda key: -1
            slurm.SHARED_CACHE = False
        lock = sharedfs.lock(target, timeout=600)
    elif how == "soft":
        import filelock
        lock = filelock.SoftFileLock(target, timeout=600, poll_interval=poll)
    open(ready, "w").close()
    if how == "wait_for":
        sharedfs.wait_for(target, timeout=600)
    elif how == "exists":  # what a training script writes (OLMo#829)
        while not os.path.exists(target):
            time.sleep(poll)
    else:
        lock.acquire()
    at = time.time()
    if how in ("sharedfs", "ungated", "soft"):
        lock.release()
    print(json.dumps({"at": at}))
""")

HOLDER = textwrap.dedent("""
    import os, sys, time
    how, target, held, release = sys.argv[1:5]
    if how in ("sharedfs", "ungated"):
        import sharedfs
        lock = sharedfs.lock(target, timeout=60)
        lock.acquire()
    elif how == "soft":
        import filelock
        lock = filelock.SoftFileLock(target, timeout=60)
        lock.acquire()
    open(held, "w").close()
    while not os.path.exists(release):
        time.sleep(0.005)
    at = time.time()
    if how in ("wait_for", "exists"):
        os.mkdir(target)
    else:
        lock.release()
    print(at)
""")

#: Counts each call (node and time) and answers like squeue for a running batch job without steps.
FAKE_SQUEUE = """#!/bin/sh
printf '%s %s\\n' "${SHAREDFS_NODE_ID:-?}" "$(date +%s.%N)" >> "$SCALE_SQUEUE_LOG"
case " $* " in *" -s "*) exit 0 ;; esac
echo "JOB|JOB|RUNNING|N/A"
""".replace("JOB", JOB)


@dataclass
class Bench:
    """One mount, one fake squeue, the knobs of every run."""

    root: Path
    mount: Any  # sharedfs.demo.hostilefs.HostileMount
    env: dict[str, str]
    poll: float
    warmup: float
    window: float
    runs: int = 0


@dataclass
class Run:
    """What one run measured."""

    how: str
    nodes: int
    ranks: int
    ops_per_node: float  # metadata ops/s, mean over waiting nodes
    ops_max_node: float
    squeue_per_node: float  # calls/s, mean over waiting nodes
    first: float  # seconds from the release to the first waiter through
    last: float  # ... to the last one
    kinds: dict[str, float]  # ops/s per node by operation kind


def setup(root: Path, poll: float, warmup: float, window: float) -> Bench:
    from sharedfs.demo.hostilefs import mount

    bin_dir = root / "bin"
    bin_dir.mkdir()
    squeue = bin_dir / "squeue"
    squeue.write_text(FAKE_SQUEUE)
    squeue.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHAREDFS_", "SLURM", "TORCHELASTIC"))}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", SCALE_SQUEUE_LOG=str(root / "squeue.log"),
               SHAREDFS_POLL_INTERVAL=str(poll), SHAREDFS_WAIT_TIMEOUT="600")
    hostile = mount(root / "backing", root / "mnt", "lustre-noflock", count_ops=True)
    return Bench(root, hostile, env, poll, warmup, window)


def spawn(bench: Bench, code: str, node: str, args: list[str], out: Path, **extra: str) -> subprocess.Popen:
    from sharedfs.demo.nodes import node_env

    env = node_env(node, bench.env, local_root=bench.root / "local", **extra)
    with open(out, "wb") as sink, open(out.with_suffix(".err"), "wb") as errors:
        return subprocess.Popen([sys.executable, "-c", code, *args], env=env, stdin=subprocess.DEVNULL,
                                stdout=sink, stderr=errors, cwd=bench.root)


def wait_until(predicate: Any, timeout: float, what: str, procs: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        failed = [p for p in procs if p.poll() not in (None, 0)]
        if failed or time.monotonic() > deadline:
            raise RuntimeError(f"{what}: {len(failed)} processes failed, or timed out after {timeout:.0f} s")
        time.sleep(0.05)


def squeue_calls(bench: Bench, since: float, until: float) -> dict[str, int]:
    calls: dict[str, int] = {}
    try:
        lines = (bench.root / "squeue.log").read_text().splitlines()
    except FileNotFoundError:
        return calls
    for line in lines:
        node, _, at = line.partition(" ")
        if since <= float(at) < until:
            calls[node] = calls.get(node, 0) + 1
    return calls


def run_once(bench: Bench, how: str, nodes: int, ranks: int) -> Run:
    from sharedfs.demo.hostilefs import METADATA_OPS, metadata_ops

    bench.runs += 1
    work = bench.root / "runs" / f"{bench.runs}-{how}-{nodes}x{ranks}"
    (work / "ready").mkdir(parents=True)
    target = str(bench.mount.path / f"{bench.runs}-{how}" / ("dir" if how in WAITS else "x.lock"))
    os.mkdir(os.path.dirname(target))
    held, release = work / "held", work / "release"
    holder = spawn(bench, HOLDER, HOLDER_NODE, [how, target, str(held), str(release)], work / "holder.out",
                   SLURM_JOB_ID=JOB, SLURMD_NODENAME="h1")
    procs = [holder]
    try:
        wait_until(held.exists, 60, "holder", procs)
        names = [f"n{i}" for i in range(nodes)]
        for node in names:
            for rank in range(ranks):
                procs.append(spawn(bench, WAITER, node, [how, target, str(work / "ready" / f"{node}-{rank}"),
                                                         str(bench.poll)], work / f"{node}-{rank}.out"))
        wait_until(lambda: len(os.listdir(work / "ready")) == nodes * ranks, 300, "waiters starting", procs)
        time.sleep(bench.warmup)  # first attempts, and backing off to the poll interval
        bench.mount.op_counts(reset=True)
        since = time.time()
        time.sleep(bench.window)
        counts = bench.mount.op_counts(reset=True)
        until = time.time()
        release.touch()
        wait_until(lambda: all(p.poll() is not None for p in procs), 300, "waiters finishing", procs)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    released = float((work / "holder.out").read_text().split()[-1])
    times = sorted(json.loads((work / f"{n}-{r}.out").read_text().splitlines()[-1])["at"]
                   for n in names for r in range(ranks))
    seconds = until - since
    per_node = [metadata_ops(counts, node) / seconds for node in names]
    queries = squeue_calls(bench, since, until)
    kinds: dict[str, float] = {}
    for node in names:
        for kind, n in counts.get(node, {}).items():
            if kind in METADATA_OPS:
                kinds[kind] = kinds.get(kind, 0.0) + n / seconds / nodes
    return Run(how, nodes, ranks, statistics.mean(per_node), max(per_node),
               statistics.mean(queries.get(node, 0) for node in names) / seconds,
               times[0] - released, times[-1] - released, kinds)


def plan_of(nodes: list[int], ranks: list[int], rounds: int) -> list[tuple[str, int, int]]:
    """Every flavour pair side by side; which side goes first alternates (ABBA), so drift hits both alike."""
    pairs = [(pair, n, r) for n in nodes for r in ranks
             for pair in (LOCKS, WAITS if r in (min(ranks), max(ranks)) else ()) if pair]
    plan: list[tuple[str, int, int]] = []
    for round_ in range(rounds):
        for index, (pair, n, r) in enumerate(pairs):
            plan += [(how, n, r) for how in (pair if (index + round_) % 2 == 0 else pair[::-1])]
        plan += [("ungated", n, max(ranks)) for n in nodes]
    return plan


def measure(bench: Bench, nodes: list[int], ranks: list[int], rounds: int, log: Any) -> list[Run]:
    """Every run of :func:`plan_of`, logged as it ends."""
    plan = plan_of(nodes, ranks, rounds)
    runs = []
    for index, (how, n, r) in enumerate(plan, 1):
        run = run_once(bench, how, n, r)
        log(f"[{index}/{len(plan)}] {how:>8} {n} nodes x {r:>2} ranks: {run.ops_per_node:7.1f} ops/s/node "
            f"(max {run.ops_max_node:.1f}), squeue {run.squeue_per_node:.2f}/s/node, first {run.first:.2f} s, "
            f"last {run.last:.2f} s")
        runs.append(run)
    return runs


def median_of(runs: list[Run], how: str, nodes: int, ranks: int, field: str) -> Optional[float]:
    values = [getattr(r, field) for r in runs if (r.how, r.nodes, r.ranks) == (how, nodes, ranks)]
    return statistics.median(values) if values else None


def growth_rows(runs: list[Run], nodes: list[int], ranks: list[int], pair: tuple[str, str], what: str) -> list[dict]:
    low, high = min(ranks), max(ranks)
    rows = []
    for n in nodes:
        grown = []
        for how in pair:
            a, b = median_of(runs, how, n, low, "ops_per_node"), median_of(runs, how, n, high, "ops_per_node")
            grown.append(b / a if a and b is not None else None)
        rows.append({"what": f"{what}, {n} nodes: metadata ops/s per node at {high} vs {low} ranks/node",
                     "sharedfs": grown[0], "baseline": grown[1], "unit": "x", "ratio": None, "goal": "<= 1.2",
                     "met": grown[0] is not None and grown[0] <= 1.2})
    return rows


def rate_rows(runs: list[Run], nodes: list[int], ranks: list[int], pair: tuple[str, str], what: str) -> list[dict]:
    rows = []
    for n in nodes:
        for r in ranks:
            ours, theirs = (median_of(runs, how, n, r, "ops_per_node") for how in pair)
            if ours is None or theirs is None:
                continue
            rows.append({"what": f"{what}, {n} nodes x {r} ranks: metadata ops/s per waiting node",
                         "sharedfs": ours, "baseline": theirs, "unit": "/s", "ratio": ours / theirs if theirs else None,
                         "goal": "-", "met": None})
    return rows


def squeue_rows(runs: list[Run], nodes: list[int], ranks: list[int]) -> list[dict]:
    rows = []
    for n in nodes:
        for r in ranks:
            ours = median_of(runs, "sharedfs", n, r, "squeue_per_node")
            if ours is None:
                continue
            theirs = median_of(runs, "ungated", n, r, "squeue_per_node")
            rows.append({"what": f"lock wait, {n} nodes x {r} ranks: squeue calls/s per node "
                                 "(baseline: sharedfs without node gates and shared answers)",
                         "sharedfs": ours, "baseline": theirs, "unit": "/s",
                         "ratio": ours / theirs if theirs else None, "goal": "<= 0.5", "met": ours <= 0.5})
    return rows


def latency_rows(runs: list[Run], nodes: list[int], ranks: list[int], poll: float) -> list[dict]:
    rows = []
    for pair, what in ((LOCKS, "lock"), (WAITS, "wait_for")):
        for n in nodes:
            for r in ranks:
                firsts = [median_of(runs, how, n, r, "first") for how in pair]
                lasts = [median_of(runs, how, n, r, "last") for how in pair]
                if firsts[0] is None or firsts[1] is None:
                    continue
                rows.append({"what": f"{what}, {n} nodes x {r} ranks: seconds from release to the first waiter "
                                     "through", "sharedfs": firsts[0], "baseline": firsts[1], "unit": "s",
                             "ratio": None, "goal": f"<= {1.5 * poll:g} (1.5 poll intervals)",
                             "met": firsts[0] <= 1.5 * poll})
                rows.append({"what": f"{what}, {n} nodes x {r} ranks: seconds from release to every waiter through",
                             "sharedfs": lasts[0], "baseline": lasts[1], "unit": "s", "ratio": None, "goal": "-",
                             "met": None})
    return rows


def ungated_rows(runs: list[Run], nodes: list[int], ranks: list[int]) -> list[dict]:
    high = max(ranks)
    rows = []
    for n in nodes:
        ours, theirs = (median_of(runs, how, n, high, "ops_per_node") for how in ("sharedfs", "ungated"))
        if ours is None or theirs is None:
            continue
        rows.append({"what": f"lock wait, {n} nodes x {high} ranks: metadata ops/s per node, sharedfs vs sharedfs "
                             "without node gates", "sharedfs": ours, "baseline": theirs, "unit": "/s",
                     "ratio": ours / theirs if theirs else None, "goal": "-", "met": None})
    return rows


def rows_of(runs: list[Run], nodes: list[int], ranks: list[int], poll: float) -> list[dict]:
    ends = [min(ranks), max(ranks)]
    return (growth_rows(runs, nodes, ranks, LOCKS, "lock wait (baseline SoftFileLock)")
            + growth_rows(runs, nodes, ends, WAITS, "wait_for (baseline exists() loop)")
            + rate_rows(runs, nodes, ranks, LOCKS, "lock wait (baseline SoftFileLock)")
            + rate_rows(runs, nodes, ends, WAITS, "wait_for (baseline exists() loop)")
            + ungated_rows(runs, nodes, ranks)
            + squeue_rows(runs, nodes, ranks)
            + latency_rows(runs, nodes, ends, poll))


def print_table(runs: list[Run]) -> None:
    print(f"{'flavour':>9} {'nodes':>5} {'ranks':>5} {'ops/s/node':>11} {'max node':>9} {'squeue/s/node':>14} "
          f"{'first s':>8} {'all s':>7}  top kinds (ops/s/node)")
    for r in runs:
        top = ", ".join(f"{k} {v:.1f}" for k, v in sorted(r.kinds.items(), key=lambda kv: -kv[1])[:4])
        print(f"{r.how:>9} {r.nodes:>5} {r.ranks:>5} {r.ops_per_node:>11.1f} {r.ops_max_node:>9.1f} "
              f"{r.squeue_per_node:>14.2f} {r.first:>8.2f} {r.last:>7.2f}  {top}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print the rows of benchmarks/run_all.py")
    parser.add_argument("--nodes", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--ranks", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--rounds", type=int, default=1, help="repeat every measurement (medians are reported)")
    parser.add_argument("--poll", type=float, default=1.0, help="SHAREDFS_POLL_INTERVAL, and the baselines' interval")
    parser.add_argument("--warmup", type=float, default=2.5, help="seconds of waiting before the window")
    parser.add_argument("--window", type=float, default=8.0, help="seconds of steady waiting that are counted")
    parser.add_argument("--raw", help="also write every run's measurements to this JSON file")
    args = parser.parse_args()

    from sharedfs.demo.hostilefs import FuseUnavailable

    root = Path(tempfile.mkdtemp(prefix="sfscale-"))
    log = (lambda text: print(text, file=sys.stderr, flush=True)) if args.json else print
    started = time.monotonic()
    try:
        bench = setup(root, args.poll, args.warmup, args.window)
    except FuseUnavailable as exc:
        print(f"cannot run: {exc}", file=sys.stderr)
        shutil.rmtree(root, ignore_errors=True)
        return 2
    try:
        runs = measure(bench, sorted(args.nodes), sorted(args.ranks), args.rounds, log)
    finally:
        bench.mount.unmount()
        shutil.rmtree(root, ignore_errors=True)
    log(f"load average at the end: {os.getloadavg()[0]:.2f} (1 min); took {time.monotonic() - started:.0f} s")
    if args.raw:
        Path(args.raw).write_text(json.dumps([vars(r) for r in runs], indent=1))
    rows = rows_of(runs, sorted(args.nodes), sorted(args.ranks), args.poll)
    for row in rows:
        row["samples"] = args.rounds
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print_table(runs)
    print()
    for row in rows:
        ours = "-" if row["sharedfs"] is None else f"{row['sharedfs']:.3g}"
        theirs = "-" if row["baseline"] is None else f"{row['baseline']:.3g}"
        verdict = "info" if row["met"] is None else "met " if row["met"] else "MISS"
        print(f"{verdict} {row['what']}: {ours} vs {theirs} {row['unit']} "
              f"(goal {row['goal']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

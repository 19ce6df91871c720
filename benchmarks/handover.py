"""What the handover rule costs on JuiceFS: acquire+release, a same-node and a cross-node handover.

A JuiceFS volume with two client mounts (two "nodes", :mod:`sharedfs.demo.realfs`), with the
client's default caches (1 s attributes and entries) and with the ``lagging`` profile (3 s).  For
each, stock filelock against ``sharedfs.lock`` in one run:

* **acquire+release**: one process, :data:`CYCLES` uncontended cycles (microseconds per cycle), also
  for sharedfs at :data:`BEFORE` (``git archive``, first on ``PYTHONPATH``): sharedfs now reads
  ``<lock>.last`` on each acquire and writes it only on a release after another node's hold.
* **same-node handover**: two processes on node a take strict turns; the latency from one's release
  to the other's acquire (median), and the seconds sharedfs waited in it (must be 0).
* **cross-node handover**: one process on node a, one on node b, strict turns; latency median and
  max.  sharedfs holds the lock for the mount's longest cache timeout before ``acquire()`` returns
  (docs/api.md, "What the next holder sees"); stock hands over at once, and its next holder may read
  what the previous one replaced through a stale dentry (counted as stale reads).

    python benchmarks/handover.py [--json] [--quick]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from _common import clean_env, emit, log, median, row

RUN_ALL_TIMEOUT = 1200
RUN_ALL_QUICK_ARGS = "--quick"
CYCLES = 200
#: sharedfs before the handover rule: acquire+release and a same-node handover must cost what they cost then.
BEFORE = "0682dc4"

CYCLE = textwrap.dedent('''
    import sys, time
    impl, lock_path, cycles = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if impl == "stock":
        import filelock
        lock = filelock.FileLock(lock_path)
    else:
        import sharedfs
        lock = sharedfs.lock(lock_path)
    with lock:  # the first acquire makes the files
        pass
    start = time.perf_counter()
    for _ in range(cycles):
        lock.acquire()
        lock.release()
    print((time.perf_counter() - start) / cycles * 1e6)
''')

#: Strict turns between the processes given (argv: impl, lock, counter, truth, turns, me, players).
TURNS = textwrap.dedent('''
    import fcntl, json, os, sys, time
    impl, lock_path, counter, truth, total, me, players = sys.argv[1:8]
    total, players = int(total), int(players)
    if impl == "stock":
        import filelock
        lock = filelock.FileLock(lock_path)
    else:
        import sharedfs
        from sharedfs.locks import _handover
        lock = sharedfs.lock(lock_path)

    def shared_truth(update=None):
        fd = os.open(truth, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            data = json.loads(os.pread(fd, 4096, 0) or b'{"value": 0, "released": 0}')
            if update is not None:
                data.update(update)
                os.ftruncate(fd, 0)
                os.pwrite(fd, json.dumps(data).encode(), 0)
            return data
        finally:
            os.close(fd)

    latencies, stale = [], 0
    while True:
        with lock:
            got = time.time()
            t = shared_truth()
            if t["value"] >= total:
                break
            if t["value"] % players == int(me):
                if t["value"]:
                    latencies.append(got - t["released"])
                try:
                    with open(counter) as f:
                        stale += int(f.read() or 0) != t["value"]
                except (OSError, ValueError):
                    stale += 1
                with open(f"{counter}.{me}", "w") as f:
                    f.write(str(t["value"] + 1))
                os.rename(f"{counter}.{me}", counter)
                shared_truth({"value": t["value"] + 1, "released": time.time()})
                continue
        time.sleep(0.05)  # not its turn: let the lock go for a while, as a program doing other work does
    waited = _handover.stats["waited"] if impl != "stock" else 0.0
    print(json.dumps({"latencies": latencies, "stale": stale, "waited": waited}))
''')


def _env(node: str, impl: str, **extra: str) -> dict[str, str]:
    return clean_env(SHAREDFS_NODE_ID=node, SHAREDFS_DISABLE="1" if impl == "stock" else "", **extra)


def before_tree(dest: Path) -> dict[str, str]:
    """sharedfs at :data:`BEFORE` (package, plugins, shims), for ``PYTHONPATH``."""
    root = Path(__file__).resolve().parents[1]
    archive = subprocess.run(["git", "-C", str(root), "archive", BEFORE, "sharedfs", "plugins", "shims",
                              "_sharedfs_bootstrap.py"], capture_output=True, check=True)
    dest.mkdir()
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    for part in ("plugins", "shims"):  # where a wheel installs them (sharedfs/__init__.py looks there first)
        (dest / part).rename(dest / "sharedfs" / part)
    return {"PYTHONPATH": str(dest)}


def cycle(mount: Path, impl: str, cycles: int, label: str = "", **extra: str) -> float:
    where = mount / f"cycle-{impl}{label}"
    where.mkdir()
    out = subprocess.run([sys.executable, "-c", CYCLE, impl, str(where / "x.lock"), str(cycles)],
                         env=_env("a", impl, **extra), capture_output=True, text=True, timeout=600, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def turns(mounts: list[Path], nodes: str, impl: str, handovers: int, lag: float, scratch: Path) -> dict:
    """Two processes on ``nodes[0]`` and ``nodes[1]`` take strict turns; latencies, stale reads, seconds waited."""
    label = f"turns-{nodes}-{impl}"
    dirs = [mounts[0 if node == "a" else 1] / label for node in nodes]
    dirs[0].mkdir()
    (dirs[0] / "counter").write_text("0")
    time.sleep(lag + 0.5)  # both nodes see them
    truth = scratch / label
    truth.write_text("")
    procs = [subprocess.Popen([sys.executable, "-c", TURNS, impl, str(dirs[i] / "x.lock"), str(dirs[i] / "counter"),
                               str(truth), str(handovers + 1), str(i), "2"], env=_env(nodes[i], impl),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    got = []
    for proc in procs:
        out, err = proc.communicate(timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(err[-2000:])
        got.append(json.loads(out.strip().splitlines()[-1]))
    latencies = [x for g in got for x in g["latencies"]]
    return {"median": median(latencies), "max": max(latencies), "stale": sum(g["stale"] for g in got),
            "waited": sum(g["waited"] for g in got) / max(len(latencies), 1)}


def measure(profile: str, quick: bool, scratch: Path, before: dict[str, str]) -> list[dict]:
    from sharedfs.demo.realfs import LAG_S, volume

    lag = LAG_S if profile == "lagging" else 1.0
    cycles, handovers = (50, 4) if quick else (CYCLES, 12)
    rows = []
    with volume("juicefs", nodes=2, profile=profile, workdir=scratch) as vol:
        mounts = list(vol.mounts)
        log(f"juicefs {profile}: acquire+release")
        stock, old = cycle(mounts[0], "stock", cycles), cycle(mounts[0], "sharedfs", cycles, "-before", **before)
        mine = cycle(mounts[0], "sharedfs", cycles)
        rows.append(row(f"JuiceFS {profile}: acquire+release, uncontended", round(mine), round(stock), "us",
                        "what sharedfs's marker costs", None))
        rows.append(row(f"JuiceFS {profile}: acquire+release, vs sharedfs at {BEFORE}", round(mine), round(old), "us",
                        "<= 1.10x: the rule costs a same-node cycle nothing", mine <= old * 1.10))
        for nodes, what in (("aa", "same-node"), ("ab", "cross-node")):
            log(f"juicefs {profile}: {what} handover")
            s, m = (turns(mounts, nodes, impl, handovers, lag, scratch) for impl in ("stock", "sharedfs"))
            same = nodes == "aa"
            rows.append(row(f"JuiceFS {profile}: {what} handover, median", round(m["median"], 3),
                            round(s["median"], 3), "s", "no wait" if same else f"about the {lag:g} s cache", None,
                            waited_per_handover=round(m["waited"], 3), handovers=handovers))
            rows.append(row(f"JuiceFS {profile}: {what} handover, max", round(m["max"], 3), round(s["max"], 3), "s",
                            "", None))
            rows.append(row(f"JuiceFS {profile}: {what} handover, seconds waited each", round(m["waited"], 3), 0.0,
                            "s", "0 on the same node" if same else f"{lag:g} s", (m["waited"] == 0) if same else None))
            rows.append(row(f"JuiceFS {profile}: {what} handover, stale reads of {handovers}", m["stale"], s["stale"],
                            "", "0", m["stale"] == 0))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="fewer cycles and handovers")
    args = parser.parse_args()
    from sharedfs.demo.realfs import unavailable

    reason = unavailable("juicefs")
    if reason:
        log(f"skipped: {reason}")
        return emit([], args.json, "handover on JuiceFS (not run)")
    with tempfile.TemporaryDirectory(prefix="sfs-bench-") as scratch:
        before = before_tree(Path(scratch) / "before")
        rows = [r for profile in ("default", "lagging") for r in measure(profile, args.quick, Path(scratch), before)]
    return emit(rows, args.json, "handover on JuiceFS: sharedfs.lock vs stock filelock")


if __name__ == "__main__":
    sys.exit(main())

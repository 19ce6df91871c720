"""sharedfs.lock against filelock, side by side in one run.

1. Uncontended acquire+release on local disk: ``sharedfs.lock`` (auto -> flock) vs
   ``filelock.FileLock``; goal <= 1.2x.
2. Uncontended on a flock-less path (LD_PRELOAD makes flock fail ENOSYS there, as on
   Lustre): ``sharedfs.lock`` (auto -> soft) vs ``filelock.SoftFileLock``; goal <= 1.2x.
3. 8 processes contending for one lock on local disk: throughput vs filelock
   (goal >= 0.9x), overlapping holds (goal 0), p99 wait / median wait (goal <= 20).

    python benchmarks/locks.py [--json] [--seconds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

UNCONTENDED = textwrap.dedent("""
    import sys, time
    which, path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if which == "sharedfs":
        import sharedfs
        lock = sharedfs.lock(path)
    else:
        import filelock
        lock = getattr(filelock, which)(path)
    for _ in range(200):  # warm-up
        lock.acquire(); lock.release()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(n):
            lock.acquire(); lock.release()
        best = min(best, (time.perf_counter() - start) / n)
    print(best, getattr(lock, "kind", which))
""")

CONTENDER = textwrap.dedent("""
    import json, sys, time
    which, path, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    if which == "sharedfs":
        import sharedfs
        lock = sharedfs.lock(path, timeout=-1)
    else:
        import filelock
        lock = filelock.FileLock(path)
    waits, holds = [], []
    start_at = float(sys.argv[4])
    while time.time() < start_at:
        time.sleep(0.001)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        asked = time.monotonic()
        lock.acquire()
        got = time.monotonic()
        time.sleep(0.0005)  # a short critical section, as a cache lookup
        holds.append((got, time.monotonic()))
        lock.release()
        waits.append(got - asked)
    print(json.dumps({"waits": waits, "holds": holds}))
""")


def run(code: str, *args: str, env: dict[str, str] | None = None) -> str:
    return subprocess.run([sys.executable, "-c", code, *args], check=True, capture_output=True, text=True,
                          env=env).stdout


def uncontended(which: str, path: str, n: int, env: dict[str, str] | None = None) -> tuple[float, str]:
    out = run(UNCONTENDED, which, path, str(n), env=env).split()
    return float(out[0]), out[1]


def contended(which: str, path: str, seconds: float, procs: int = 8) -> dict[str, float]:
    start_at = str(time.time() + 1.5)  # let every interpreter start before the clock runs
    children = [subprocess.Popen([sys.executable, "-c", CONTENDER, which, path, str(seconds), start_at],
                                 stdout=subprocess.PIPE, text=True) for _ in range(procs)]
    waits, holds = [], []
    for child in children:
        data = json.loads(child.communicate()[0])
        waits += data["waits"]
        holds += data["holds"]
    holds.sort()
    overlaps = sum(1 for (_, end), (start, _) in zip(holds, holds[1:]) if start < end)
    waits.sort()
    median = statistics.median(waits)
    p99 = waits[int(len(waits) * 0.99) - 1]
    return {"throughput": len(holds) / seconds, "overlaps": overlaps, "median_wait": median, "p99_wait": p99}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("-n", type=int, default=3000)
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHAREDFS_")}
    rows = []
    with tempfile.TemporaryDirectory() as local:
        s, kind = uncontended("sharedfs", f"{local}/a.lock", args.n, env)
        f, _ = uncontended("FileLock", f"{local}/b.lock", args.n, env)
        rows.append({"what": f"uncontended acquire+release, local disk ({kind} vs FileLock)",
                     "sharedfs": s * 1e6, "baseline": f * 1e6, "unit": "us", "ratio": s / f, "goal": "<= 1.2", "met": s / f <= 1.2})

        from sharedfs.testing.preload import preload_env

        flockless = os.path.join(local, "lustre")
        os.mkdir(flockless)
        fault = preload_env([flockless], "ENOSYS", base=env)
        s, kind = uncontended("sharedfs", f"{flockless}/a.lock", args.n, fault)
        f, _ = uncontended("SoftFileLock", f"{flockless}/b.lock", args.n, fault)
        rows.append({"what": f"uncontended, flock ENOSYS path ({kind} vs SoftFileLock)",
                     "sharedfs": s * 1e6, "baseline": f * 1e6, "unit": "us", "ratio": s / f, "goal": "<= 1.2", "met": s / f <= 1.2})

        ours = contended("sharedfs", f"{local}/c.lock", args.seconds)
        theirs = contended("filelock", f"{local}/d.lock", args.seconds)
        rows.append({"what": "8 processes contending: throughput (holds/s)", "sharedfs": ours["throughput"],
                     "baseline": theirs["throughput"], "unit": "/s",
                     "ratio": ours["throughput"] / theirs["throughput"], "goal": ">= 0.9",
                     "met": ours["throughput"] >= 0.9 * theirs["throughput"]})
        rows.append({"what": "8 processes contending: overlapping holds", "sharedfs": ours["overlaps"],
                     "baseline": theirs["overlaps"], "unit": "", "ratio": None, "goal": "0",
                     "met": ours["overlaps"] == 0})
        rows.append({"what": "8 processes contending: p99 wait / median wait",
                     "sharedfs": ours["p99_wait"] / ours["median_wait"],
                     "baseline": theirs["p99_wait"] / theirs["median_wait"], "unit": "x", "ratio": None,
                     "goal": "<= 20", "met": ours["p99_wait"] <= 20 * ours["median_wait"]})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'what':<62}{'sharedfs':>12}{'baseline':>12}{'ratio':>8}  goal")
    for row in rows:
        ratio = f"{row['ratio']:.2f}" if row["ratio"] is not None else "-"
        print(f"{row['what']:<62}{row['sharedfs']:>10.1f}{row['unit']:<2}{row['baseline']:>10.1f}{row['unit']:<2}"
              f"{ratio:>8}  {row['goal']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

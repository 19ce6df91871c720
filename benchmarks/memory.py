"""What sharedfs costs in memory: resident set per framework, and a leak check of its locks.

1. Resident set of a process that imports a framework (and, for datasets, takes one of its
   cache locks, which loads sharedfs's lock machinery), with sharedfs against
   ``SHAREDFS_DISABLE=1``, alternating; VmRSS and VmHWM from ``/proc/self/status`` of the child
   itself (``ru_maxrss`` would report a peak inherited across fork+exec from this parent).
   Goal for datasets: <= 2 MB more; the other shims are reported.
2. Leak check: ``--cycles`` (100,000) acquire/release cycles of ``sharedfs.lock`` for the flock
   and soft kinds -- one lock object reused, and a new object per cycle as frameworks make them
   -- after a warm-up: growth of the Python heap (tracemalloc, exact) over the second half of the
   cycles, when one-time growth (interning tables, the allocator's pools) is over: goal <= 64 kB,
   i.e. flat; the resident set is in the note.  File descriptors left open: goal 0, counted in
   ``/proc/self/fd``.  The same cycles of filelock's FileLock/SoftFileLock give the stock figures.

    python benchmarks/memory.py [--json] [--quick] [--runs 5] [--cycles 100000]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap

from _common import alternate, at_most, clean_env, emit, log, median, row

#: benchmarks/run_all.py gives this benchmark this long (seconds) on a quiet 2-core machine.
RUN_ALL_TIMEOUT = 2400

RSS = textwrap.dedent("""
    import json, os, sys, tempfile
    exec(sys.argv[1])
    status = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(("VmRSS", "VmHWM")):
                key, value = line.split(":", 1)
                status[key] = int(value.split()[0])
    print(json.dumps(status))
""")

#: Framework -> what the process does.
FRAMEWORKS = {
    "datasets (import + one cache lock)": "import datasets\nfrom datasets.utils._filelock import FileLock\n"
                                          "with FileLock(os.path.join(tempfile.mkdtemp(), 'x.lock')):\n    pass",
    "huggingface_hub (hf_hub_download)": "from huggingface_hub import hf_hub_download",
    "webdataset": "import webdataset",
    "wids": "import wids",
    "mmengine": "import mmengine",
    "xtuner": "import xtuner.dataset.huggingface",
    "torch": "import torch",
}

LEAK = textwrap.dedent("""
    import gc, json, os, sys, tracemalloc
    which, kind, path, cycles, fresh = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5] == "fresh"
    if which == "sharedfs":
        import sharedfs
        make = lambda: sharedfs.lock(path, kind=kind)
    else:
        import filelock
        cls = filelock.FileLock if kind == "flock" else filelock.SoftFileLock
        make = lambda: cls(path)
    def rss():
        with open("/proc/self/status") as fh:
            return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS"))
    def fds():
        return len(os.listdir("/proc/self/fd"))
    def state():
        gc.collect()
        return rss(), tracemalloc.get_traced_memory()[0], fds()
    lock = make()
    def run(n):
        global lock
        for _ in range(n):
            if fresh:
                lock = make()
            lock.acquire()
            lock.release()
    run(max(10000, cycles // 10))  # warm-up: caches, interning tables, the allocator's pools
    tracemalloc.start(1)
    start = state()
    run(cycles // 2)  # tables and pools reach their steady size
    middle = state()
    run(cycles - cycles // 2)
    end = state()
    print(json.dumps({"rss_growth_kb": end[0] - middle[0], "rss_growth_all_kb": end[0] - start[0],
                      "traced_growth_b": end[1] - middle[1], "traced_growth_all_b": end[1] - start[1],
                      "fds_left": end[2] - start[2]}))
""")


def rss(code: str, env: dict[str, str]) -> dict[str, int]:
    proc = subprocess.run([sys.executable, "-c", RSS, code], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def rss_rows(args: argparse.Namespace, env: dict[str, str]) -> list[dict]:
    rows = []
    off = {**env, "SHAREDFS_DISABLE": "1"}
    for name, code in FRAMEWORKS.items():
        try:
            rss(code, off)
        except RuntimeError as exc:
            rows.append(row(f"resident set: {name}", None, None, "MB", "-", None, note=f"not installed here: {exc}"))
            continue
        log(f"resident set: {name} ...")
        a, b = alternate(lambda code=code: rss(code, env), lambda code=code: rss(code, off), args.runs)
        ours, theirs = median([x["VmRSS"] for x in a]) / 1024, median([y["VmRSS"] for y in b]) / 1024
        hwm = (median([x["VmHWM"] for x in a]) - median([y["VmHWM"] for y in b])) / 1024
        delta = ours - theirs
        datasets = name.startswith("datasets")
        rows.append(row(f"resident set: {name}, sharedfs vs SHAREDFS_DISABLE=1", ours, theirs, "MB",
                        "<= +2 MB" if datasets else "-", at_most(delta, 2.0) if datasets else None,
                        delta_mb=delta, samples=len(a),
                        note=f"sharedfs adds {delta:+.2f} MB resident (VmRSS), {hwm:+.2f} MB peak (VmHWM)"))
    return rows


def leak(which: str, kind: str, cycles: int, fresh: bool, env: dict[str, str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="sharedfs-bench-leak-") as tmp:
        proc = subprocess.run([sys.executable, "-c", LEAK, which, kind, f"{tmp}/x.lock", str(cycles),
                               "fresh" if fresh else "same"], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"leak check {which} {kind} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def leak_rows(args: argparse.Namespace, env: dict[str, str]) -> list[dict]:
    rows = []
    for kind, stock in (("flock", "FileLock"), ("soft", "SoftFileLock")):
        for fresh in (False, True):
            how = "a new lock object per cycle" if fresh else "one lock object"
            log(f"leak check: {kind}, {how}, {args.cycles:,} cycles ...")
            ours, theirs = leak("sharedfs", kind, args.cycles, fresh, env), leak("filelock", kind, args.cycles, fresh, env)
            what = f"leak check: {args.cycles:,} cycles of sharedfs.lock(kind={kind!r}), {how}"
            rows.append(row(f"{what}: Python heap growth over the second half (stock: filelock.{stock})",
                            ours["traced_growth_b"] / 1024, theirs["traced_growth_b"] / 1024, "kB", "<= 64 kB (flat)",
                            at_most(ours["traced_growth_b"] / 1024, 64), ratio=None,
                            note=f"tracemalloc; resident set {ours['rss_growth_kb']:+d} kB over the second half, "
                                 f"{ours['rss_growth_all_kb']:+d} kB in all (stock {theirs['rss_growth_kb']:+d} / "
                                 f"{theirs['rss_growth_all_kb']:+d} kB); Python heap "
                                 f"{ours['traced_growth_all_b'] / 1024:+.0f} kB in all (tables reaching their size)"))
            rows.append(row(f"{what}: file descriptors left open (stock: filelock.{stock})", ours["fds_left"],
                            theirs["fds_left"], "", "0", ours["fds_left"] == 0, ratio=None))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="processes per side for each resident-set figure")
    parser.add_argument("--cycles", type=int, default=100_000)
    parser.add_argument("--no-rss", dest="rss", action="store_false")
    parser.add_argument("--no-leak", dest="leak", action="store_false")
    parser.add_argument("--quick", action="store_true", help="a short run to check that everything works")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.cycles = 1, 5_000
    env = clean_env()
    rows = (rss_rows(args, env) if args.rss else []) + (leak_rows(args, env) if args.leak else [])
    return emit(rows, args.json, "memory")


if __name__ == "__main__":
    sys.exit(main())

"""What ``sharedfs locks`` costs the shared filesystem: filesystem calls per entry of a 10,000-file cache.

A cache tree of ``--files`` (10,000) shard files in directories of 100, with a few lock files and
markers (a live holder's, a dead one's), is walked by ``sharedfs locks TREE`` under ``strace -f -c``
(file and descriptor system calls only); the same for a tree of 100 files.  The difference per
added entry is the walk's cost per entry, without the interpreter's start-up: goal <= 0.1 (one
listing per directory of 100 entries costs a few calls; a plain file costs none -- no stat, no
open).  The baseline is what a person does today, ``ls -laR TREE`` (a stat per entry), counted the
same way.  Calls, not time: the count is what a metadata server sees, and repeats exactly.

    python benchmarks/locks_walk.py [--json] [--quick] [--files 10000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import at_most, clean_env, emit, log, row

#: benchmarks/run_all.py gives this benchmark this long (seconds).
RUN_ALL_TIMEOUT = 600
GOAL = 0.1


def make_tree(top: Path, files: int) -> None:
    for i in range(files):
        directory = top / f"d{i // 100:03d}"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"shard-{i:06d}.tar").touch()
    (top / "d000" / "free.lock").touch()
    (top / "d000" / "dead.lock.held").write_text('{"node":"elsewhere","pid":12,"acquired_at":1,"kind":"soft"}')


def traced_calls(argv: list[str], work: Path) -> int:
    """File and descriptor system calls ``argv`` makes (strace -f -c), start-up included."""
    out = work / "strace.out"
    subprocess.run(["strace", "-f", "-c", "-o", str(out), "-e", "trace=%file,%desc", *argv], capture_output=True,
                   env=clean_env(), check=False, timeout=300)
    totals = [line for line in out.read_text().splitlines() if line.rstrip().endswith("total")]
    return int(totals[-1].split()[3])  # % time, seconds, usecs/call, calls, errors, "total"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="a 2,000-file tree")
    parser.add_argument("--files", type=int, default=10_000)
    args = parser.parse_args()
    files = 2_000 if args.quick else args.files
    if shutil.which("strace") is None:
        log("strace is not installed: cannot count system calls")
        return 2
    with tempfile.TemporaryDirectory(prefix="sharedfs-bench-walk-") as tmp:
        work = Path(tmp)
        small, large = work / "small", work / "large"
        make_tree(small, 100)
        make_tree(large, 100 + files)
        log(f"sharedfs locks and ls -laR on trees of 100 and {100 + files} files, under strace ...")
        ours = [traced_calls([sys.executable, "-m", "sharedfs", "locks", str(tree)], work) for tree in (small, large)]
        stock = [traced_calls(["ls", "-laR", str(tree)], work) for tree in (small, large)]
    per_entry = (ours[1] - ours[0]) / files
    baseline = (stock[1] - stock[0]) / files
    dirs = files / 100
    return emit([row(f"sharedfs locks: filesystem calls per entry of a {files:,}-file cache tree", round(per_entry, 4),
                     round(baseline, 4), "calls", f"<= {GOAL}", at_most(per_entry, GOAL),
                     floor=round(dirs / files, 4), floor_what="one listing (getdents) per directory of 100 entries",
                     note=f"whole run: {ours[1]:,} calls for {100 + files:,} files (start-up included); baseline: "
                          f"`ls -laR`, what people do today ({os.cpu_count()} CPUs)")],
                args.json, "sharedfs locks: cost of the walk")


if __name__ == "__main__":
    sys.exit(main())

"""What ``sharedfs locks --clear-dead`` costs on a deep tree: a chain of 100, 200, 300 and 2,100 directories.

A member of a team can make a chain of directories as deep as she likes in the team's cache; the
operator (root, at 3 a.m.) runs ``sharedfs locks --clear-dead`` on the cache.  sharedfs before
:data:`BEFORE` re-descended from the top for every directory, counting every level against its
2,000 calls/s budget: depth²/2 calls, minutes at depth 2,100.  Now each directory is opened once
from its parent's descriptor, and a directory more than 128 levels down is reported, not walked.

For each depth, a chain ``d/d/d/...`` with a dead holder's marker 50 levels down (its holder
SIGKILLed), timed as wall-clock seconds of one ``python -m sharedfs locks --clear-dead --json``
process: this checkout against sharedfs at :data:`BEFORE` (``git archive``, first on
``PYTHONPATH``), alternating (ABBA), ``--runs`` each (one each at 2,100 levels: the old walk takes
about 18 minutes there).  The floor is the same command on an empty directory (start-up).  One
more row lifts the depth limit (``MAX_DEPTH`` set high in the child): the whole 2,100-level chain
walked, against the old walk of the same chain.  (The calls per directory, constant at every depth,
are counted in tests/integration/test_locks_deep_tree.py.)

    python benchmarks/locks_deep.py [--json] [--quick] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from functools import partial
from pathlib import Path

from _common import alternate, at_most, clean_env, emit, log, median, row

#: benchmarks/run_all.py gives this benchmark this long (seconds): the old walk at 2,100 levels takes ~18 min.
RUN_ALL_TIMEOUT = 2700
#: sharedfs before the walk kept its ancestors open (issue 48's round: main at 18c02b8).
BEFORE = "18c02b8"
DEPTHS = (100, 200, 300, 2100)
#: The dead holder's marker sits this many levels down (inside every chain, and inside the depth limit).
MARKER_DEPTH = 50
NODE = {"SHAREDFS_NODE_ID": "bench-node"}

#: Takes the soft lock argv[1], says so, waits to be killed.
HOLDER = textwrap.dedent("""
    import sys, time, sharedfs
    lock = sharedfs.lock(sys.argv[1], kind="soft", timeout=30)  # kept: a lock object collected is released
    lock.acquire()
    print("held", flush=True)
    time.sleep(3600)
""")

#: `sharedfs locks` with the depth limit lifted (argv: the command's own).
UNLIMITED = textwrap.dedent("""
    import sys
    from sharedfs.commands import lockwalk
    lockwalk.MAX_DEPTH = 10 ** 6
    from sharedfs.commands.cli import main
    sys.exit(main())
""")


def chain(top: Path, depth: int) -> Path:
    """``top/d/d/...`` ``depth`` levels deep (by descriptor: the path outgrows PATH_MAX); its dead marker."""
    top.mkdir()
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            below = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = below
    finally:
        os.close(fd)
    lock = top.joinpath(*["d"] * MARKER_DEPTH, "x.lock")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock)], env=clean_env(**NODE), text=True,
                              stdout=subprocess.PIPE)
    assert holder.stdout is not None
    ready = holder.stdout.readline().strip()
    holder.kill()
    holder.wait()
    marker = Path(f"{lock}.held")
    if ready != "held" or not marker.exists():
        raise SystemExit(f"the holder at {lock} left no marker")
    return marker


def before_tree(dest: Path) -> dict[str, str]:
    """sharedfs at BEFORE (package, plugins, shims), first on PYTHONPATH; exit 2 where git history is missing."""
    root = Path(__file__).resolve().parents[1]
    archive = subprocess.run(["git", "-C", str(root), "archive", BEFORE, "sharedfs", "plugins", "shims",
                              "_sharedfs_bootstrap.py"], capture_output=True, check=False)
    if archive.returncode != 0:
        log(f"cannot run sharedfs at {BEFORE}: {archive.stderr.decode().strip()}")
        raise SystemExit(2)
    dest.mkdir()
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    for part in ("plugins", "shims"):  # where a wheel installs them (sharedfs/__init__.py looks there first)
        (dest / part).rename(dest / "sharedfs" / part)
    return {"PYTHONPATH": str(dest)}


def one(work: Path, depth: int, env: dict[str, str], code: list[str]) -> float:
    """Seconds of ``python CODE CHAIN`` on a fresh ``depth``-level chain (removed afterwards)."""
    top = Path(tempfile.mkdtemp(prefix=f"chain-{depth}-", dir=work)) / "cache"
    marker = chain(top, depth)
    try:
        seconds = timed([sys.executable, *code, str(top)], env)
        if marker.exists():  # a figure for a clear that did not clear is no figure
            raise SystemExit(f"{' '.join(code)} {top} left the dead marker {marker}")
        return seconds
    finally:
        subprocess.run(["rm", "-rf", str(top.parent)], check=False)  # shutil.rmtree recurses once per level


def timed(argv: list[str], env: dict[str, str]) -> float:
    """Wall-clock seconds of ``argv`` (exit 0 or 1: a run that failed is no figure)."""
    started = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, cwd="/", check=False)
    seconds = time.monotonic() - started
    if done.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(argv[:6])} ... failed ({done.returncode}): {done.stderr[-2000:]}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="depths 100, 300 and 2,100; the old walk at 100 only")
    parser.add_argument("--runs", type=int, default=3, help="runs per side at depths up to 300")
    args = parser.parse_args()
    if shutil.which("git") is None:
        log("git is not installed: cannot run sharedfs as it was")
        return 2
    depths = (100, 300, 2100) if args.quick else DEPTHS
    old_at = {100} if args.quick else set(DEPTHS)
    with tempfile.TemporaryDirectory(prefix="sharedfs-bench-deep-") as tmp:
        work = Path(tmp)
        before_env = clean_env(**NODE, **before_tree(work / "before"))
        after_env = clean_env(**NODE)
        command = ["-m", "sharedfs", "locks", "--clear-dead", "--json"]
        try:
            (work / "empty").mkdir()
            floor = median([timed([sys.executable, *command, str(work / "empty")], after_env)
                            for _ in range(args.runs)])
            times: dict[int, tuple[float, float | None, float]] = {}
            lift = ["-c", UNLIMITED, "locks", "--clear-dead", "--json"]
            for depth in depths:
                runs = 1 if depth > 300 else args.runs
                log(f"sharedfs locks --clear-dead on a {depth}-level chain: this checkout"
                    + (f" and sharedfs at {BEFORE}" if depth in old_at else "") + f", {runs} run(s) each ...")
                if depth in old_at:
                    new, old = alternate(partial(one, work, depth, after_env, command),
                                         partial(one, work, depth, before_env, command), runs)
                    old_s: float | None = median(old)
                else:
                    new, old_s = [one(work, depth, after_env, command) for _ in range(runs)], None
                lifted = median([one(work, depth, after_env, lift) for _ in range(runs)])
                times[depth] = (median(new), old_s, lifted)
                log(f"  {depth} levels: {times[depth][0]:.2f} s now (limit lifted: {lifted:.2f} s), before: "
                    + (f"{old_s:.2f} s" if old_s is not None else "not run"))
        finally:
            for left in work.glob("chain-*"):
                subprocess.run(["rm", "-rf", str(left)], check=False)
    rows = []
    for depth, (new_s, old_s, lifted) in times.items():
        limited = " (128 levels walked, the rest reported)" if depth > 128 else ""
        rows.append(row(f"sharedfs locks --clear-dead on a {depth:,}-level chain{limited}", round(new_s, 3),
                        None if old_s is None else round(old_s, 3), "s", "<= 1.0",
                        at_most(new_s / old_s, 1.0) if old_s else None, floor=round(floor, 3),
                        floor_what="the same command on an empty directory (start-up)",
                        samples=1 if depth > 300 else args.runs,
                        note=f"baseline: sharedfs at {BEFORE} (re-descends from the top for every directory); "
                             f"with the depth limit lifted this checkout walks all {depth:,} levels in "
                             f"{lifted:.2f} s"))
    deepest = max(times)
    _, old_s, lifted = times[deepest]
    rows.append(row(f"the same, {deepest:,} levels, depth limit lifted: every level walked", round(lifted, 3),
                    None if old_s is None else round(old_s, 3), "s", "-", None, floor=round(floor, 3),
                    floor_what="the same command on an empty directory (start-up)", samples=1,
                    note=f"{(lifted - floor) / deepest * 1000:.2f} ms per level above start-up (the walk's "
                         "2,000 calls/s budget: 3 calls per level); baseline: sharedfs at " + BEFORE))
    return emit(rows, args.json, "sharedfs locks on a deep tree")


if __name__ == "__main__":
    sys.exit(main())

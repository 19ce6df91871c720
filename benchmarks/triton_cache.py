"""Triton's kernel cache with and without sharedfs: what a warm cache hit costs.

A hit is what ``triton.compiler.compile`` does for a kernel it compiled before:
``get_cache_manager(key)``, ``get_group("<kernel>.json")``, then every file of the group read
back (as ``CompiledKernel`` does).  One process does ``--kernels`` hits ``--repeat`` times over
a cache populated beforehand (local disk: the cost of sharedfs's code, not of a network
filesystem's latency), with sharedfs's ``SharedFSFileCacheManager`` against
``SHAREDFS_DISABLE=1`` (Triton's ``FileCacheManager``), in alternating runs; the median of the
per-pair ratios, goal <= 1.02.  With valgrind, the same hits in user-space instructions (one
``--repeat`` rounds of hits minus none, each side), which repeat exactly on a loaded machine.

    python benchmarks/triton_cache.py [--json] [--quick] [--runs 15] [--kernels 50] [--repeat 20]

Runs the interpreter it is started with (triton and sharedfs installed); exit 2 without triton.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from _common import alternate, clean_env, instructions, median, paired_ratio, row, valgrind

#: argv: kernels, rounds.  Prints the seconds of ``rounds`` rounds of hits after one warm-up round.
HITS = textwrap.dedent("""
    import hashlib, json, os, sys, time
    from triton.runtime.cache import get_cache_manager
    kernels, rounds = int(sys.argv[1]), int(sys.argv[2])
    keys = [hashlib.sha256(b"kernel %d" % i).hexdigest() for i in range(kernels)]

    def hits():
        for i, key in enumerate(keys):
            group = get_cache_manager(key).get_group(f"k{i}.json")
            for path in group.values():
                with open(path, "rb") as fh:
                    fh.read()

    hits()  # warm-up: imports, page cache
    start = time.perf_counter()
    for _ in range(rounds):
        hits()
    print(json.dumps({"seconds": time.perf_counter() - start}))
""")

POPULATE = textwrap.dedent("""
    import hashlib, json, sys
    from triton.runtime.cache import get_cache_manager
    for i in range(int(sys.argv[1])):
        manager = get_cache_manager(hashlib.sha256(b"kernel %d" % i).hexdigest())
        body = hashlib.sha256(b"%d" % i).digest() * 512  # 16 KiB, a small cubin
        group = {name: manager.put(data, name) for name, data in
                 ((f"k{i}.ttir", b"ttir" + body), (f"k{i}.cubin", b"\\x7fELF" + body),
                  (f"k{i}.json", json.dumps({"name": f"k{i}"}).encode()))}
        manager.put_group(f"k{i}.json", group)
""")


def run_hits(cache: Path, kernels: int, rounds: int, disabled: bool) -> float:
    env = clean_env(TRITON_CACHE_DIR=cache, **({"SHAREDFS_DISABLE": "1"} if disabled else {}))
    proc = subprocess.run([sys.executable, "-c", HITS, str(kernels), str(rounds)], capture_output=True, text=True,
                          env=env)
    if proc.returncode:
        raise SystemExit(f"triton hits ({'stock' if disabled else 'sharedfs'}) failed:\n{proc.stderr[-3000:]}")
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["seconds"]) / (kernels * rounds) * 1e6


def hit_instructions(cache: Path, kernels: int, rounds: int, disabled: bool) -> int | None:
    """Instructions per hit: ``rounds`` rounds minus none (many rounds: a garbage collection that happens to fall
    into one short round would dominate it)."""
    env = clean_env(TRITON_CACHE_DIR=cache, **({"SHAREDFS_DISABLE": "1"} if disabled else {}))
    some = instructions([sys.executable, "-c", HITS, str(kernels), str(rounds)], env)
    none = instructions([sys.executable, "-c", HITS, str(kernels), "0"], env)
    return None if some is None or none is None else (some - none) // (kernels * rounds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="alternating runs per side (default 15)")
    parser.add_argument("--kernels", type=int, default=50, help="kernels in the cache (default 50)")
    parser.add_argument("--repeat", type=int, default=20, help="rounds of hits per run (default 20)")
    parser.add_argument("--no-callgrind", action="store_true", help="skip the instruction counts")
    parser.add_argument("--json", action="store_true", help="print the results as JSON rows")
    parser.add_argument("--quick", action="store_true", help="a short run to check that everything works")
    args = parser.parse_args()
    if importlib.util.find_spec("triton") is None:
        print("triton is not installed here", file=sys.stderr)
        return 2
    if args.quick:
        args.runs, args.kernels, args.repeat, args.no_callgrind = 2, 5, 2, True

    with tempfile.TemporaryDirectory(prefix="sharedfs-bench-triton-") as tmp:
        cache = Path(tmp) / "cache"
        subprocess.run([sys.executable, "-c", POPULATE, str(args.kernels)], check=True,
                       env=clean_env(TRITON_CACHE_DIR=cache, SHAREDFS_DISABLE="1"))
        ours, stock = alternate(lambda: run_hits(cache, args.kernels, args.repeat, False),
                                lambda: run_hits(cache, args.kernels, args.repeat, True), args.runs)
        counted = None
        if not args.no_callgrind and valgrind() is not None:
            counted = (hit_instructions(cache, args.kernels, args.repeat, False),
                       hit_instructions(cache, args.kernels, args.repeat, True))
    ratio, spread = paired_ratio(ours, stock)
    rows = [row("warm Triton cache hit (get_cache_manager + get_group + read the group's files)", median(ours),
                median(stock), "us", "<= 1.02", ratio <= 1.02, ratio=ratio, spread=spread, samples=args.runs,
                note=f"{args.kernels} kernels x {args.repeat} rounds per run, local disk")]
    if counted is not None and counted[0] and counted[1]:
        rows.append(row("warm Triton cache hit, instructions (callgrind)", counted[0], counted[1], "instr",
                        "<= 1.02", counted[0] / counted[1] <= 1.02,
                        note="user-space instructions per hit; system calls are not counted (the us row has them)"))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for made in rows:
        print(f"{made['what']}: stock {made['baseline']:.4g} {made['unit']}, sharedfs {made['sharedfs']:.4g} "
              f"{made['unit']}, ratio {made['ratio']:.3f} (goal {made['goal']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The warm path of the tvm_ffi shim against stock, in one run: a cached ``tvm_ffi.cpp.load_inline``.

A module built once; then ``load_inline`` of the same source again and again, as every process of a
job does once the cache is warm: hash the source, ``mkdir``, take the build lock ``<build_dir>/lock``,
run ninja (a no-op), load the ``.so``.  tvm-ffi's own lock (``tvm_ffi.utils.FileLock``: flock) against
the shim's (sharedfs's lock: flock on local disk, as here).  Goal <= 1.05.

One process per ``--runs``, the shim applied (``Shim.patch``) and removed by turns, ``--rounds`` paired
rounds in ABBA order of ``-n`` calls each; the ratio is the median of the per-round ratios, with its
spread (half the IQR).

    python benchmarks/tvm_ffi_warm.py [--json] [--quick] [--runs 3] [--rounds 10] [-n 20]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap

from _common import at_most, clean_env, emit, log, median, paired_ratio, row

#: One process: ``rounds n`` -> JSON {"pairs": [[shim, stock] seconds per call, one per round]}.
LOOP = textwrap.dedent("""
    import json, sys, time
    import tvm_ffi.cpp
    from sharedfs.model.policy import resolve
    from sharedfs.shims.tvm_ffi import TvmFfiShim

    rounds, n = int(sys.argv[1]), int(sys.argv[2])
    shim, policy = TvmFfiShim(), resolve([])

    def call():
        module = tvm_ffi.cpp.load_inline("add_one", cpp_sources="int add_one(int x) { return x + 1; }",
                                         functions=["add_one"])
        assert module.add_one(1) == 2

    def side(patched):
        shim.patch(policy) if patched else shim.unpatch()

    for patched in (True, False):  # the cold build, then both sides warm
        side(patched)
        for _ in range(3):
            call()
    pairs = []
    for r in range(rounds):
        took = {}
        for patched in ((True, False) if r % 2 == 0 else (False, True)):
            side(patched)
            start = time.perf_counter()
            for _ in range(n):
                call()
            took[patched] = (time.perf_counter() - start) / n
        pairs.append([took[True], took[False]])
    print(json.dumps({"pairs": pairs}))
""")


def measure(runs: int, rounds: int, n: int) -> list[list[float]]:
    pairs: list[list[float]] = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="sharedfs-bench-tvm-ffi-") as cache:
            # The shim blocked at start-up: the process applies and removes it itself.
            env = clean_env(SHAREDFS_DISABLE="tvm_ffi", TVM_FFI_CACHE_DIR=cache)
            out = subprocess.run([sys.executable, "-c", LOOP, str(rounds), str(n)], check=True, capture_output=True,
                                 text=True, env=env).stdout
            pairs += json.loads(out.strip().splitlines()[-1])["pairs"]
    return pairs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="a short run to check that everything works")
    parser.add_argument("--runs", type=int, default=3, help="processes per measurement")
    parser.add_argument("--rounds", type=int, default=10, help="paired rounds per process")
    parser.add_argument("-n", type=int, default=20, help="calls per side per round")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.rounds, args.n = 1, 4, 5
    log("tvm-ffi: a cached load_inline (hash, mkdir, build lock, ninja no-op, load) ...")
    pairs = measure(args.runs, args.rounds, args.n)
    shim, stock = [p for p, _ in pairs], [s for _, s in pairs]
    paired, spread = paired_ratio(shim, stock)
    rows = [row("tvm-ffi load_inline, cache warm (build lock + ninja no-op + load)", median(shim) * 1e3,
                median(stock) * 1e3, "ms", "<= 1.05", at_most(paired, 1.05), ratio=paired, samples=len(pairs),
                spread=spread, note=f"median of {len(pairs)} per-round ratios ({args.runs} processes, the shim "
                                    f"applied and removed by turns, ABBA), spread +-{spread or 0:.3f}")]
    return emit(rows, args.json, "tvm_ffi shim: warm path")


if __name__ == "__main__":
    sys.exit(main())

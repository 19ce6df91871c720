"""What sharedfs adds to ``from transformers import AutoConfig``: the import that applies the transformers shim.

``AutoConfig`` imports ``transformers.dynamic_module_utils``, the shim's target: with sharedfs on,
that import also loads sharedfs's machinery, its plugins and the shim, and applies it.  Each side
is a fresh process (``python -c "from transformers import AutoConfig"``), sharedfs on or
``SHAREDFS_DISABLE=1``, ``--runs`` per side in alternating order (ABBA); goal <= 1.02:

1. wall time of the import statement, timed inside the process (interpreter start-up excluded);
2. CPU time (user + sys) of the whole process, from the kernel's accounting of the child (``wait4``);
3. user-space instructions of the whole process (valgrind callgrind, one fixed hash seed per run,
   ``--seeds`` runs per side; ``--no-callgrind`` skips): the figure that repeats on a loaded
   machine.  ``perf stat -e instructions`` would do, but virtual machines like this one often do not
   expose the counter.

    python benchmarks/transformers_import.py [--json] [--quick] [--runs 20] [--seeds 2] [--no-callgrind]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

from _common import alternate, at_most, clean_env, emit, instructions, log, median, paired_ratio, row, valgrind

STATEMENT = "from transformers import AutoConfig"

#: One process: the statement timed inside it -> JSON {"wall": s, "sharedfs": whether the shim is applied}.
PROGRAM = textwrap.dedent(f"""
    import json, sys, time
    start = time.perf_counter()
    {STATEMENT}
    wall = time.perf_counter() - start
    import transformers.dynamic_module_utils as d
    print(json.dumps({{"wall": wall, "sharedfs": "modulecache" in d.get_cached_module_file.__code__.co_filename}}))
""")


def run(env: dict[str, str], expect_on: bool) -> tuple[float, float]:
    """Wall time of the import and CPU time (user + sys) of the whole process, reaped with ``wait4``."""
    proc = subprocess.Popen([sys.executable, "-c", PROGRAM], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{STATEMENT!r} failed (exit {proc.returncode})")
    result = json.loads(out.strip().splitlines()[-1])
    if result["sharedfs"] != expect_on:
        raise RuntimeError(f"the transformers shim was {'not ' if expect_on else ''}applied where it should "
                           f"{'' if expect_on else 'not '}be")
    return result["wall"], usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="a short run to check that everything works")
    parser.add_argument("--runs", type=int, default=20, help="processes per side")
    parser.add_argument("--seeds", type=int, default=2, help="callgrind runs per side (one hash seed each)")
    parser.add_argument("--no-callgrind", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.no_callgrind = 4, True
    with tempfile.TemporaryDirectory(prefix="sharedfs-bench-transformers-import-") as home:
        base = dict(HF_HOME=home, HF_HUB_OFFLINE=1, TRANSFORMERS_VERBOSITY="error")
        on, off = clean_env(**base), clean_env(**base, SHAREDFS_DISABLE=1)
        run(on, True), run(off, False)  # warm the page cache for both sides
        log(f"{STATEMENT}: {args.runs} fresh processes per side, alternating ...")
        with_sfs, stock = alternate(lambda: run(on, True), lambda: run(off, False), args.runs)
        rows = []
        for i, (what, unit, scale) in enumerate((("wall time of the import", "ms", 1e3),
                                                  ("CPU time (user+sys) of the process", "ms", 1e3))):
            a, b = [x[i] for x in with_sfs], [x[i] for x in stock]
            paired, spread = paired_ratio(a, b)
            rows.append(row(f"{STATEMENT}: {what}, sharedfs vs SHAREDFS_DISABLE=1", median(a) * scale,
                            median(b) * scale, unit, "<= 1.02", at_most(paired, 1.02), ratio=paired,
                            samples=args.runs, spread=spread,
                            note=f"ratio: median of {args.runs} per-pair ratios (fresh processes, ABBA), "
                                 f"spread +-{spread or 0:.3f} (half the IQR)"))
        if not args.no_callgrind and valgrind():
            log(f"{STATEMENT}: instructions (callgrind), {args.seeds} runs per side ...")
            argv = [sys.executable, "-c", STATEMENT]
            counts_on = [instructions(argv, on, seed=seed) for seed in range(args.seeds)]
            counts_off = [instructions(argv, off, seed=seed) for seed in range(args.seeds)]
            a, b = [float(c) for c in counts_on if c], [float(c) for c in counts_off if c]
            paired, _ = paired_ratio(a, b)
            rows.append(row(f"{STATEMENT}: instructions (callgrind) of the process, sharedfs vs SHAREDFS_DISABLE=1",
                            median(a), median(b), "instr", "<= 1.02", at_most(paired, 1.02), ratio=paired,
                            samples=len(a), note=f"median over hash seeds 0..{args.seeds - 1}; per seed: "
                                                 + ", ".join(f"{x / y:.4f}" for x, y in zip(a, b))))
    return emit(rows, args.json, f"{STATEMENT}: sharedfs on vs SHAREDFS_DISABLE=1")


if __name__ == "__main__":
    sys.exit(main())

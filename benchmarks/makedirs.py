"""The makedirs guard's success path: ``os.makedirs`` / ``Path.mkdir`` of an existing directory, with and without it.

The ``makedirs`` shim wraps both functions; on the success path the wrapper only calls the
original inside a ``try`` (the guard itself runs on the error path alone).  Every rank creates
its run directory, often in a loop (``exist_ok=True`` on an existing directory is the common
call), so the wrapper must cost nothing measurable there:

1. wall time per call, one process per measurement, ``--runs`` processes per side in
   alternating order (ABBA): stock vs guarded, judged by the median of the per-pair ratios
   (goal <= 1.02, the spread stated); floor: the system calls the call cannot avoid
   (``mkdir`` answering EEXIST, then ``stat``), timed from Python;
2. user-space instructions per call (valgrind callgrind, the difference of two loop lengths,
   median over several hash seeds), for the shim's guard and for the pending guard ``import torch``
   puts in place before sharedfs loads: repeatable on a loaded machine, and what the wrapper's frame
   costs (one Python call, about 500 instructions, against two system calls and the stdlib's own
   error handling); informational, as wall time judges.

The guarded side applies the shim in the measuring process (``MakedirsShim().patch``), as
``import torch`` does, without importing torch: the loop is what is measured.  Both sides (and
the floor) load the shim's module, so the patch is the only difference.

    python benchmarks/makedirs.py [--json] [--quick] [--runs 9] [-n 20000] [--no-callgrind]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
from concurrent.futures import ThreadPoolExecutor

from _common import (
    alternate,
    at_most,
    clean_env,
    emit,
    log,
    median,
    paired_ratio,
    per_cycle_instructions,
    row,
    valgrind,
)

#: One process: ``which call path rounds warm-up n`` -> JSON {"per_call": [seconds per call, one per round]}.
LOOP = textwrap.dedent("""
    import json, os, pathlib, sys, time
    which, call, path, rounds, warm, n = (sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]),
                                          int(sys.argv[5]), int(sys.argv[6]))
    # Both sides load the shim's module (the kernel with it): what differs is the patch alone.  Importing
    # the kernel moves this loop's instruction count by itself (~2 %: more live objects for the collector
    # the loop's exceptions wake, another dict layout), with or without the guard.
    from sharedfs.model.policy import resolve
    from sharedfs.shims.makedirs import MakedirsShim

    if which == "guarded":  # the shim's guard
        MakedirsShim().patch(resolve([]))
        assert os.makedirs.__wrapped__ and pathlib.Path.mkdir.__wrapped__
    elif which == "pending":  # what `import torch` puts in place until the first error that could be the guard's
        from sharedfs.machinery import pending

        pending.install(lambda: None)
        assert os.makedirs.__wrapped__ and pathlib.Path.mkdir.__wrapped__
    if which == "floor":  # what either call cannot avoid: mkdir answering EEXIST, then stat (is it a directory?)
        def cycle():
            try:
                os.mkdir(path)
            except FileExistsError:
                os.stat(path)
    elif call == "os":
        makedirs = os.makedirs  # looked up once either way: the same on both sides
        def cycle():
            makedirs(path, exist_ok=True)
    else:
        p = pathlib.Path(path)
        def cycle():
            p.mkdir(parents=True, exist_ok=True)
    for _ in range(warm):
        cycle()
    per_call = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(n):
            cycle()
        per_call.append((time.perf_counter() - start) / n)
    print(json.dumps({"per_call": per_call}))
""")

#: Calls before timing (or before the counted window).
WARM_UP = 2000
#: The two loop lengths whose difference callgrind counts, and the processes (hash seeds) per side.
CALLGRIND_CYCLES = (2000, 10000)
CALLGRIND_PROCESSES = 3


def one(which: str, call: str, path: str, args: argparse.Namespace) -> float:
    out = subprocess.run([sys.executable, "-c", LOOP, which, call, path, str(args.rounds), str(WARM_UP), str(args.n)],
                         check=True, capture_output=True, text=True, env=clean_env()).stdout
    return statistics.median(json.loads(out.strip().splitlines()[-1])["per_call"])


def wall_row(call: str, label: str, path: str, args: argparse.Namespace) -> dict:
    floors: list[float] = []

    def guarded_then_floor() -> float:
        floors.append(one("floor", call, path, args))
        return one("guarded", call, path, args)

    a, b = alternate(guarded_then_floor, lambda: one("stock", call, path, args), args.runs)
    paired, spread = paired_ratio(a, b)
    return row(f"{label} of an existing directory, per call", median(a) * 1e6, median(b) * 1e6, "us", "<= 1.02",
               at_most(paired, 1.02), ratio=paired, floor=median(floors) * 1e6,
               floor_what="mkdir (EEXIST) + stat from Python", samples=len(a), spread=spread,
               note=f"ratio: median of {len(a)} per-pair ratios, spread +-{spread or 0:.3f} (half the IQR); "
                    f"the two sides' medians: {median(a) * 1e6:.2f} us guarded, {median(b) * 1e6:.2f} us stock")


def instructions_rows(call: str, label: str, path: str) -> list[dict]:
    sides = ("guarded", "pending", "stock", "floor")

    def count(which: str, seed: int) -> float | None:
        return per_cycle_instructions([sys.executable, "-c", LOOP, which, call, path, "1", "500"], CALLGRIND_CYCLES,
                                      clean_env(), seed=seed)

    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {(which, seed): pool.submit(count, which, seed)
                   for seed in range(CALLGRIND_PROCESSES) for which in sides}
        counts = {key: future.result() for key, future in futures.items()}
    per = {which: [counts[(which, seed)] for seed in range(CALLGRIND_PROCESSES)] for which in sides}
    if any(value is None for values in per.values() for value in values):
        return []
    medians = {which: median(per[which]) for which in sides}  # type: ignore[arg-type]
    rows = []
    for which, what in (("guarded", "the shim's guard"), ("pending", "the pending guard, before sharedfs loads")):
        ratio = medians[which] / medians["stock"]
        # Informational: the wall-time rows judge "within noise"; these say what the wrapper's frame costs.
        rows.append(row(f"instructions per {label} of an existing directory, {what} (callgrind)", medians[which],
                        medians["stock"], "instr", "-", None, ratio=ratio, floor=medians["floor"], floor_what="mkdir (EEXIST) + stat from Python",
                        samples=CALLGRIND_PROCESSES,
                        note=f"median of {CALLGRIND_PROCESSES} processes per side (one hash seed each): "
                             f"+{medians[which] - medians['stock']:.0f} instructions a call, the wrapper's frame; "
                             "user-space instructions only (the system calls' kernel share is the same on both sides)"))
    return rows


def main() -> int:
    global WARM_UP, CALLGRIND_CYCLES, CALLGRIND_PROCESSES
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="a short run to check that everything works")
    parser.add_argument("--runs", type=int, default=9, help="processes per side")
    parser.add_argument("--rounds", type=int, default=5, help="timed loops per process")
    parser.add_argument("-n", type=int, default=20000, help="calls per loop")
    parser.add_argument("--no-callgrind", dest="callgrind", action="store_false")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.rounds, args.n, WARM_UP = 3, 3, 2000, 200
        CALLGRIND_CYCLES, CALLGRIND_PROCESSES = (500, 1500), 1
    rows = []
    with tempfile.TemporaryDirectory(prefix="sharedfs-bench-makedirs-") as work:  # a local disk: no guard acts
        for call, label in (("os", "os.makedirs(exist_ok=True)"), ("pathlib", "Path.mkdir(parents=True, exist_ok=True)")):
            log(f"{label}: wall time ...")
            rows.append(wall_row(call, label, work, args))
            if args.callgrind and valgrind():
                log(f"{label}: instructions (callgrind) ...")
                rows.extend(instructions_rows(call, label, work))
    return emit(rows, args.json, "os.makedirs / Path.mkdir with the makedirs guard vs the standard library")


if __name__ == "__main__":
    sys.exit(main())

"""The transformers shim's warm path: ``AutoConfig.from_pretrained(repo, trust_remote_code=True)`` with its module cached.

Every load after the first finds the remote-code module in ``HF_MODULES_CACHE``: transformers
still runs ``get_cached_module_file`` (resolve the file in the hub cache, check its imports,
``exists()`` on every module file) and hashes the files before reusing the imported module.
The shim wraps ``get_cached_module_file`` (a thread-local counter) and copies nothing, takes no
lock, when every file is in place; this must cost nothing measurable per load:

1. wall time per ``from_pretrained``, one process per measurement, ``--runs`` processes per side in
alternating order (ABBA): the shim applied vs ``SHAREDFS_DISABLE=transformers`` (everything else
of sharedfs the same on both sides), judged by the median of the per-pair ratios (goal <= 1.02,
the spread stated).  The model is the tests' (``sharedfs/testing/remotecode.py``: a 115 kB configuration
module with a relative import), in an offline hub cache on local disk;
2. Python function calls per load (cProfile), informational: repeatable on a loaded machine.

    python benchmarks/transformers_warm.py [--json] [--quick] [--runs 9] [-n 200]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from _common import alternate, at_most, clean_env, emit, log, median, paired_ratio, row

from sharedfs.testing import remotecode  # the tests' remote-code model

#: One process: ``repo rounds warm-up n`` -> JSON {"per_call": [seconds per load, one per round]}.
LOOP = textwrap.dedent("""
    import json, sys, time
    from transformers import AutoConfig
    import transformers.dynamic_module_utils as d
    repo, rounds, warm, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    patched = "modulecache" in d.get_cached_module_file.__code__.co_filename
    for _ in range(warm):
        AutoConfig.from_pretrained(repo, trust_remote_code=True)
    per_call = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(n):
            AutoConfig.from_pretrained(repo, trust_remote_code=True)
        per_call.append((time.perf_counter() - start) / n)
    import cProfile, pstats
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(3):
        AutoConfig.from_pretrained(repo, trust_remote_code=True)
    profile.disable()
    calls = pstats.Stats(profile).total_calls / 3
    print(json.dumps({"per_call": per_call, "patched": patched, "calls": calls}))
""")

WARM_UP = 20


#: Python function calls per load (cProfile), per side: deterministic where wall time on a loaded machine is not.
CALLS: dict[bool, list[float]] = {True: [], False: []}


def one(patched: bool, env: dict[str, str], args: argparse.Namespace) -> float:
    side = dict(env) if patched else {**env, "SHAREDFS_DISABLE": "transformers"}
    out = subprocess.run([sys.executable, "-c", LOOP, "bench/remote", str(args.rounds), str(WARM_UP), str(args.n)],
                         check=True, capture_output=True, text=True, env=side).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["patched"] is patched, "the shim was (not) applied where it should (not) be"
    CALLS[patched].append(result["calls"])
    return statistics.median(result["per_call"])


def main() -> int:
    global WARM_UP
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="a short run to check that everything works")
    parser.add_argument("--runs", type=int, default=9, help="processes per side")
    parser.add_argument("--rounds", type=int, default=5, help="timed loops per process")
    parser.add_argument("-n", type=int, default=20, help="loads per loop")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.rounds, args.n, WARM_UP = 2, 2, 20, 5
    with tempfile.TemporaryDirectory(prefix="sharedfs-bench-transformers-") as work:
        hub = Path(work) / "hub"
        remotecode.make_repo(hub, "bench/remote")
        env = clean_env(HF_HUB_OFFLINE=1, HF_HUB_CACHE=hub, HF_HOME=Path(work) / "home",
                        TRANSFORMERS_VERBOSITY="error")
        subprocess.run([sys.executable, "-c", LOOP, "bench/remote", "1", "1", "1"], check=True, capture_output=True,
                       env=env)  # the cold load: the module cache is warm for both sides from here on
        log("AutoConfig.from_pretrained on a warm module cache: wall time ...")
        a, b = alternate(lambda: one(True, env, args), lambda: one(False, env, args), args.runs)
    paired, spread = paired_ratio(a, b)
    rows = [row("AutoConfig.from_pretrained(trust_remote_code=True), module cached, per call", median(a) * 1e3,
                median(b) * 1e3, "ms", "<= 1.02", at_most(paired, 1.02), ratio=paired, samples=len(a), spread=spread,
                note=f"ratio: median of {len(a)} per-pair ratios, spread +-{spread or 0:.3f} (half the IQR); "
                     f"the two sides' medians: {median(a) * 1e3:.3f} ms with the shim, {median(b) * 1e3:.3f} ms "
                     "with SHAREDFS_DISABLE=transformers"),
            # Informational: what the shim adds to a warm load, counted rather than timed.
            row("Python function calls per warm from_pretrained (cProfile)", median(CALLS[True]), median(CALLS[False]),
                "calls", "-", None, samples=len(CALLS[True]),
                note=f"+{median(CALLS[True]) - median(CALLS[False]):.0f} calls a load: the wrapper of "
                     "get_cached_module_file; no lock, no copy")]
    return emit(rows, args.json, "transformers remote code, warm module cache: the shim vs without it")


if __name__ == "__main__":
    sys.exit(main())

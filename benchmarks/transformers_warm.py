"""The transformers shim's warm path: ``AutoConfig.from_pretrained(repo, trust_remote_code=True)`` with its module cached.

Every load after the first finds the remote-code module in ``HF_MODULES_CACHE``: transformers
still runs ``get_cached_module_file`` (resolve the file in the hub cache, check its imports,
``exists()`` on every module file) and hashes the files before reusing the imported module.
The shim wraps ``get_cached_module_file`` (a thread-local counter) and copies nothing, takes no
lock, when every file is in place; this must cost nothing measurable per load:

1. wall time per ``from_pretrained`` in ``--runs`` processes started with ``SHAREDFS_DISABLE=transformers``
(everything else of sharedfs as usual), each applying the shim (``TransformersShim().patch``) and
removing it by turns, ``--rounds`` paired rounds in ABBA order: judged by the median of the
per-round ratios (goal <= 1.02, the spread stated).  One process per side was tried first: on a
loaded 2-core machine the process-to-process spread (+-0.75) drowned any difference.  The model is the tests' (``sharedfs/demo/remotecode.py``: a 115 kB configuration
module with a relative import), in an offline hub cache on local disk;
2. Python function calls per load (cProfile), informational: repeatable on a loaded machine.

    python benchmarks/transformers_warm.py [--json] [--quick] [--runs 3] [--rounds 20] [-n 5]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from _common import at_most, clean_env, emit, log, median, paired_ratio, row

from sharedfs.demo import remotecode  # the tests' remote-code model

#: One process: ``repo rounds warm-up n`` -> JSON {"pairs": [[patched, stock] seconds per load, one pair per round],
#: "calls": {"patched": ..., "stock": ...}}.  The shim is blocked at start-up and applied / removed here, round by
#: round in ABBA order, so both sides share one process, its imports and its moment on a loaded machine.
LOOP = textwrap.dedent("""
    import cProfile, json, pstats, sys, time
    from transformers import AutoConfig
    import transformers.dynamic_module_utils as d
    from sharedfs.model.policy import resolve
    from sharedfs.shims.transformers import TransformersShim

    repo, rounds, warm, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    shim, policy = TransformersShim(), resolve([])
    assert "modulecache" not in d.get_cached_module_file.__code__.co_filename  # blocked at start-up

    def side(patched):
        if patched:
            shim.patch(policy)
            assert "modulecache" in d.get_cached_module_file.__code__.co_filename
        else:
            shim.unpatch()

    def load():
        AutoConfig.from_pretrained(repo, trust_remote_code=True)

    for _ in range(warm):
        load()
    pairs = []
    for r in range(rounds):
        took = {}
        for patched in ((True, False) if r % 2 == 0 else (False, True)):
            side(patched)
            start = time.perf_counter()
            for _ in range(n):
                load()
            took[patched] = (time.perf_counter() - start) / n
        pairs.append([took[True], took[False]])
    calls = {}
    for patched in (True, False):
        side(patched)
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(3):
            load()
        profile.disable()
        calls["patched" if patched else "stock"] = pstats.Stats(profile).total_calls / 3
    print(json.dumps({"pairs": pairs, "calls": calls}))
""")

WARM_UP = 5


def main() -> int:
    global WARM_UP
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="a short run to check that everything works")
    parser.add_argument("--runs", type=int, default=3, help="processes")
    parser.add_argument("--rounds", type=int, default=20, help="paired rounds per process")
    parser.add_argument("-n", type=int, default=5, help="loads per side per round")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.rounds, args.n, WARM_UP = 1, 4, 2, 2
    pairs: list[list[float]] = []
    calls: dict[str, list[float]] = {"patched": [], "stock": []}
    with tempfile.TemporaryDirectory(prefix="sharedfs-bench-transformers-") as work:
        hub = Path(work) / "hub"
        remotecode.make_repo(hub, "bench/remote")
        env = clean_env(HF_HUB_OFFLINE=1, HF_HUB_CACHE=hub, HF_HOME=Path(work) / "home",
                        TRANSFORMERS_VERBOSITY="error", SHAREDFS_DISABLE="transformers")
        log("AutoConfig.from_pretrained on a warm module cache: wall time, the shim applied and removed by turns ...")
        for _ in range(args.runs):
            out = subprocess.run([sys.executable, "-c", LOOP, "bench/remote", str(args.rounds), str(WARM_UP),
                                  str(args.n)], check=True, capture_output=True, text=True, env=env).stdout
            result = json.loads(out.strip().splitlines()[-1])
            pairs += result["pairs"]
            for key in calls:
                calls[key].append(result["calls"][key])
    patched, stock = [p for p, _ in pairs], [s for _, s in pairs]
    paired, spread = paired_ratio(patched, stock)
    rows = [row("AutoConfig.from_pretrained(trust_remote_code=True), module cached, per call", median(patched) * 1e3,
                median(stock) * 1e3, "ms", "<= 1.02", at_most(paired, 1.02), ratio=paired, samples=len(pairs),
                spread=spread,
                note=f"ratio: median of {len(pairs)} per-round ratios ({args.runs} processes, the shim applied and "
                     f"removed by turns, ABBA), spread +-{spread or 0:.3f} (half the IQR); the two sides' medians: "
                     f"{median(patched) * 1e3:.3f} ms with the shim, {median(stock) * 1e3:.3f} ms without"),
            # Informational: what the shim adds to a warm load, counted rather than timed.
            row("Python function calls per warm from_pretrained (cProfile)", median(calls["patched"]),
                median(calls["stock"]), "calls", "-", None, samples=len(calls["patched"]),
                note=f"+{median(calls['patched']) - median(calls['stock']):.0f} calls a load: the wrapper of "
                     "get_cached_module_file; no lock, no copy")]
    return emit(rows, args.json, "transformers remote code, warm module cache: the shim vs without it")


if __name__ == "__main__":
    sys.exit(main())

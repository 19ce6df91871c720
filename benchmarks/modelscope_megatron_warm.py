"""The warm paths of the modelscope and megatron shims against stock, in one run.

1. **ModelScope's download lock**: ``with modelscope_hub._download._optional_file_lock(<cache>/.lock/<file>.lock,
   control=...)``, uncontended, on local disk -- what ``download_file`` takes around every file it fetches
   (a cached file is found before the lock and takes none): the hub's own (``filelock.FileLock``) against
   the shim's (filelock's class behind sharedfs's kinds: flock here).  Goal <= 1.2 (the house's lock goal
   for a lock built per call, as the hub builds one per download).
2. **Megatron's cached index load**: ``GPTDataset._build_document_sample_shuffle_indices`` with the cache
   warm (megatron: four ``isfile`` and three ``numpy.load(mmap_mode="r")``; the shim adds an open and a
   header read per file to know each is whole).  Goal <= 1.05.

Each side runs in one process per ``--runs``, the shim applied (``Shim.patch``) and removed by turns,
``--rounds`` paired rounds in ABBA order of ``-n`` calls each; the ratio is the median of the per-round
ratios, with its spread (half the IQR).

    python benchmarks/modelscope_megatron_warm.py [--json] [--quick] [--runs 3] [--rounds 20] [-n 200]
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

#: One process: ``what work rounds n`` -> JSON {"pairs": [[shim, stock] seconds per call, one per round]}.
LOOP = textwrap.dedent("""
    import json, sys, time, warnings
    warnings.filterwarnings("ignore")
    from pathlib import Path
    from sharedfs.model.policy import resolve

    what, work, rounds, n = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    if what == "modelscope":
        from modelscope_hub import _download
        from modelscope_hub._download_control import _DownloadControl
        from sharedfs.shims.modelscope import ModelScopeShim as Shim
        lock_path = work / ".lock" / "file_0123.lock"

        def call():
            with _DownloadControl(total_timeout=600) as control:
                with _download._optional_file_lock(lock_path, control=control):
                    pass
    else:
        from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
        from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
        sys.path.insert(0, sys.argv[5])
        from mgworker import TinyTokenizer, prepare
        from sharedfs.shims.megatron import MegatronShim as Shim
        prepare(str(work / "tiny"))
        config = GPTDatasetConfig(random_seed=1234, sequence_length=16, blend=([str(work / "tiny")], None),
                                  split="1,0,0", path_to_cache=str(work / "cache"), tokenizer=TinyTokenizer(),
                                  reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False)
        dataset = BlendedMegatronDatasetBuilder(GPTDataset, [20000, None, None], lambda: True, config).build()[0]

        def call():
            dataset._build_document_sample_shuffle_indices()

    shim, policy = Shim(), resolve([])

    def side(patched):
        shim.patch(policy) if patched else shim.unpatch()

    for patched in (True, False):
        side(patched)
        for _ in range(n):
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

HELPERS = Path(__file__).resolve().parents[1] / "tests" / "helpers"


def measure(what: str, runs: int, rounds: int, n: int) -> list[list[float]]:
    pairs: list[list[float]] = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix=f"sharedfs-bench-{what}-") as work:
            # Both shims blocked at start-up: each process applies and removes its shim itself.
            env = clean_env(SHAREDFS_DISABLE="modelscope,megatron")
            out = subprocess.run([sys.executable, "-c", LOOP, what, work, str(rounds), str(n), str(HELPERS)],
                                 check=True, capture_output=True, text=True, env=env).stdout
            pairs += json.loads(out.strip().splitlines()[-1])["pairs"]
    return pairs


def result(what: str, pairs: list[list[float]], goal: float, runs: int) -> dict:
    shim, stock = [p for p, _ in pairs], [s for _, s in pairs]
    paired, spread = paired_ratio(shim, stock)
    return row(what, median(shim) * 1e6, median(stock) * 1e6, "us", f"<= {goal}", at_most(paired, goal),
               ratio=paired, samples=len(pairs), spread=spread,
               note=f"median of {len(pairs)} per-round ratios ({runs} processes, the shim applied and removed by "
                    f"turns, ABBA), spread +-{spread or 0:.3f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="a short run to check that everything works")
    parser.add_argument("--runs", type=int, default=3, help="processes per measurement")
    parser.add_argument("--rounds", type=int, default=20, help="paired rounds per process")
    parser.add_argument("-n", type=int, default=200, help="calls per side per round")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.rounds, args.n = 1, 4, 20
    log("ModelScope: _optional_file_lock acquire + release, uncontended, local disk ...")
    lock = measure("modelscope", args.runs, args.rounds, args.n)
    log("Megatron: a cached GPTDataset index load ...")
    load = measure("megatron", args.runs, args.rounds, max(1, args.n // 4))
    rows = [result("ModelScope download lock (_optional_file_lock), acquire + release", lock, 1.2, args.runs),
            result("Megatron GPTDataset index load, cache warm", load, 1.05, args.runs)]
    return emit(rows, args.json, "modelscope and megatron shims: warm paths")


if __name__ == "__main__":
    sys.exit(main())

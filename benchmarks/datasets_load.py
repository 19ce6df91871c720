"""What the datasets shim costs, and what it saves: warm loads and cold preparation by many ranks.

Runs real ``datasets`` in fresh processes of this interpreter (which must have sharedfs
installed, e.g. the dev venv); ``SHAREDFS_DISABLE=1`` gives the baseline in the same
environment, so the only difference is sharedfs.

* **warm**: ``load_dataset("json")`` + a cached ``.map()`` on local disk, cache already
  prepared.  Time measured inside the process around the two calls (interpreter start-up
  and ``import datasets`` are benchmarks/startup.py's business); runs alternate between
  sharedfs and the baseline so drift hits both alike.  Goal (issue 4): <= 1.05x.
* **cold**: N processes (default 8) released at the same moment prepare the same dataset
  into one empty cache; wall time from release to the last process done, against one
  process preparing alone.  With sharedfs one rank prepares and maps, the others wait and
  load.  Goal: <= 1.2x.  The baseline column shows the same N processes without sharedfs
  (datasets' flock serialises the preparation on a local disk, but every rank runs the map).

    python benchmarks/datasets_load.py [--runs 15] [--repeats 3] [--procs 8] [--rows 1000000] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

WORKER = r"""
import json, os, sys, time
import datasets
datasets.disable_progress_bars()
data, cache, gate, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
if gate != "-":
    open(os.path.join(gate, str(os.getpid())), "w").close()
    while len(os.listdir(gate)) < count:
        time.sleep(0.001)
start = time.time()
ds = datasets.load_dataset("json", data_files=data, cache_dir=cache, split="train")
ds = ds.map(lambda batch: {"y": [x * 2 for x in batch["x"]]}, batched=True)
end = time.time()
print(json.dumps({"start": start, "end": end, "rows": len(ds)}))
"""


def child_env(sharedfs: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHAREDFS_", "PYTHON", "HF_"))}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    if not sharedfs:
        env["SHAREDFS_DISABLE"] = "1"
    return env


def run_group(data: Path, cache: Path, procs: int, sharedfs: bool, work: Path) -> float:
    """Start ``procs`` workers, release them together, return release -> last finish (s)."""
    gate = Path(tempfile.mkdtemp(dir=work, prefix="gate-"))
    children = [subprocess.Popen([sys.executable, "-c", WORKER, str(data), str(cache), str(gate), str(procs)],
                                 env=child_env(sharedfs), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for _ in range(procs)]
    reports = []
    for child in children:
        out, err = child.communicate()
        if child.returncode != 0:
            raise SystemExit(f"worker failed:\n{err}")
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return max(r["end"] for r in reports) - min(r["start"] for r in reports)


def warm(data: Path, work: Path, runs: int) -> list[dict]:
    cache = work / "warm-cache"
    run_group(data, cache, 1, True, work)  # prepare once; every timed run below is a cache hit
    with_sfs, without = [], []
    for _ in range(runs):
        with_sfs.append(run_group(data, cache, 1, True, work))
        without.append(run_group(data, cache, 1, False, work))
    a, b = statistics.median(with_sfs) * 1e3, statistics.median(without) * 1e3
    return [{"what": "warm load_dataset + cached map, local disk (vs SHAREDFS_DISABLE=1)", "sharedfs": a,
             "baseline": b, "unit": "ms", "ratio": a / b, "goal": "<= 1.05", "met": a / b <= 1.05}]


def cold(data: Path, work: Path, procs: int, repeats: int) -> list[dict]:
    alone, many, many_without = [], [], []
    for i in range(repeats):
        alone.append(run_group(data, work / f"cold-alone-{i}", 1, True, work))
        many.append(run_group(data, work / f"cold-many-{i}", procs, True, work))
        many_without.append(run_group(data, work / f"cold-without-{i}", procs, False, work))
    one, a, b = statistics.median(alone), statistics.median(many), statistics.median(many_without)
    return [
        {"what": f"cold prepare: {procs} processes, one shared cache (vs 1 process alone)", "sharedfs": a,
         "baseline": one, "unit": "s", "ratio": a / one, "goal": "<= 1.2", "met": a / one <= 1.2},
        {"what": f"cold prepare: {procs} processes with sharedfs (vs the same without)", "sharedfs": a,
         "baseline": b, "unit": "s", "ratio": a / b, "goal": "<= 1.0", "met": a <= b},
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="warm runs per side")
    parser.add_argument("--repeats", type=int, default=3, help="cold rounds")
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows of the JSON dataset (~2 s to prepare here)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sharedfs-bench-datasets-"))
    try:
        data = work / "data.jsonl"
        with data.open("w") as fh:
            for i in range(args.rows):
                fh.write(json.dumps({"x": i, "text": f"row {i} " * 4}) + "\n")
        rows = warm(data, work, args.runs) + cold(data, work, args.procs, args.repeats)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:  # the row schema of benchmarks/run_all.py
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'what':<72}{'sharedfs':>12}{'baseline':>12}{'ratio':>8}  goal")
    for row in rows:
        print(f"{row['what']:<72}{row['sharedfs']:>10.2f}{row['unit']:<2}{row['baseline']:>10.2f}{row['unit']:<2}"
              f"{row['ratio']:>8.3f}  {row['goal']}{'' if row['met'] else '  (not met)'}")
    print(f"({args.rows:,} rows; {os.cpu_count()} CPUs; medians of {args.runs} warm runs and {args.repeats} cold rounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""webdataset's shard cache with and without sharedfs: downloads per shard, and warm-cache speed.

1. **Fetches per shard per node**: N reader processes of one node (default 8, started
   together) each read every shard through ``WebDataset(urls, cache_dir=...)`` from a
   local HTTP server (``sharedfs.demo.shardserver``, with a small per-request latency so
   downloads overlap as they do against object storage).  Plain webdataset has no lock:
   every reader that misses downloads.  sharedfs: 1.0 per shard, the physical limit.
2. **Warm-cache samples/s**: one process reads every sample of a populated cache (no
   network) through ``WebDataset``; runs alternate between ``SHAREDFS_DISABLE=1`` and
   sharedfs so drift hits both alike; medians and their ratio (goal >= 0.97x).
3. **The same epoch in instructions** (callgrind, when valgrind is installed): one more pass
   over the warm cache minus none, each side.  Wall time on a shared 2-core machine moves by
   several per cent from run to run; user-space instructions repeat exactly (system calls
   are not in them: the wall figure has those).

    python benchmarks/webdataset_cache.py [--readers 8] [--runs 7] [--json] [--quick]

Runs the interpreter it is started with (webdataset, torch and sharedfs installed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from _common import instructions, valgrind

from sharedfs.demo.shardserver import ShardServer, make_shards

FETCH = textwrap.dedent("""
    import json, os, sys
    from sharedfs.demo.shardserver import start_together
    import webdataset as wds
    ds = wds.WebDataset(json.loads(os.environ["T_URLS"]), cache_dir=os.environ["T_CACHE"], shardshuffle=False,
                        empty_check=False)
    start_together(os.environ["T_GATE"])
    print(sum(1 for _ in ds))
""")

WARM = textwrap.dedent("""
    import json, os, sys, time
    import webdataset as wds
    urls = json.loads(os.environ["T_URLS"])
    ds = wds.WebDataset(urls, cache_dir=os.environ["T_CACHE"], shardshuffle=False, empty_check=False)
    n = sum(1 for _ in ds)  # warm-up pass: page cache, lazy imports
    start = time.perf_counter()
    for _ in range(int(os.environ["T_EPOCHS"])):
        n = sum(1 for _ in ds)
    print(json.dumps({"samples": n * int(os.environ["T_EPOCHS"]), "seconds": time.perf_counter() - start}))
""")


#: One warm pass more than the count of passes in argv[1] (0: the warm-up only).
COUNT = textwrap.dedent("""
    import json, os, sys
    import webdataset as wds
    ds = wds.WebDataset(json.loads(os.environ["T_URLS"]), cache_dir=os.environ["T_CACHE"], shardshuffle=False,
                        empty_check=False)
    for _ in range(1 + int(sys.argv[1])):
        n = sum(1 for _ in ds)
""")


def child_env(**extra: object) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHAREDFS_", "WDS_", "PYTHON"))}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def fetches(server: ShardServer, work: Path, readers: int, disable: bool) -> dict[str, float]:
    label = "plain" if disable else "sharedfs"
    cache, gate = work / f"fetch-{label}", work / f"gate-{label}"
    cache.mkdir()
    server.reset()
    env = child_env(T_URLS=json.dumps(server.urls(server.shard_names())), T_CACHE=cache, T_GATE=gate,
                    SHAREDFS_TEST_COUNT=readers, **({"SHAREDFS_DISABLE": "1"} if disable else {}))
    procs = [subprocess.Popen([sys.executable, "-c", FETCH], env={**env, "SHAREDFS_TEST_INDEX": str(i)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(readers)]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        if proc.returncode != 0:
            raise SystemExit(f"{label} reader failed:\n{err}")
    counts = server.counts()
    per_shard = [counts.get(name, 0) for name in server.shard_names()]
    return {"mean": statistics.mean(per_shard), "max": max(per_shard), "total": sum(per_shard)}


def warm(server: ShardServer, work: Path, runs: int, epochs: int) -> dict[str, float]:
    cache = work / "warm"
    cache.mkdir()
    urls = json.dumps(server.urls(server.shard_names()))
    # Populate once (with sharedfs, so both runs read the same published files).
    subprocess.run([sys.executable, "-c", WARM], env=child_env(T_URLS=urls, T_CACHE=cache, T_EPOCHS=1),
                   check=True, capture_output=True)
    rates: dict[str, list[float]] = {"plain": [], "sharedfs": []}
    for _ in range(runs):
        for label, extra in (("sharedfs", {}), ("plain", {"SHAREDFS_DISABLE": "1"})):
            proc = subprocess.run([sys.executable, "-c", WARM], capture_output=True, text=True,
                                  env=child_env(T_URLS=urls, T_CACHE=cache, T_EPOCHS=epochs, **extra))
            if proc.returncode != 0:
                raise SystemExit(f"warm {label} run failed:\n{proc.stderr}")
            out = json.loads(proc.stdout.strip().splitlines()[-1])
            rates[label].append(out["samples"] / out["seconds"])
    return {label: statistics.median(values) for label, values in rates.items()}


def warm_instructions(server: ShardServer, work: Path, shards: int) -> dict[str, int] | None:
    """User-space instructions of one warm pass over ``shards`` shards, each side (None without valgrind)."""
    if valgrind() is None:
        return None
    cache = work / "count"
    cache.mkdir()
    urls = json.dumps(server.urls(server.shard_names()[:shards]))
    subprocess.run([sys.executable, "-c", COUNT, "0"], env=child_env(T_URLS=urls, T_CACHE=cache), check=True,
                   capture_output=True)  # populate
    counts: dict[str, int] = {}
    for label, extra in (("sharedfs", {}), ("plain", {"SHAREDFS_DISABLE": "1"})):
        env = child_env(T_URLS=urls, T_CACHE=cache, **extra)
        one, none = (instructions([sys.executable, "-c", COUNT, n], env) for n in ("1", "0"))
        if one is None or none is None:
            return None
        counts[label] = one - none
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readers", type=int, default=8, help="reader processes on the node (default 8)")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--runs", type=int, default=7, help="alternating warm-cache runs per side (default 7)")
    parser.add_argument("--epochs", type=int, default=3, help="passes over the warm cache per run")
    parser.add_argument("--latency", type=float, default=0.05, help="server delay per request, seconds")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--quick", action="store_true", help="a short run to check that everything works")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.epochs, args.shards = 2, 1, 4

    with tempfile.TemporaryDirectory(prefix="sharedfs-bench-wds-") as tmp:
        work = Path(tmp)
        make_shards(work / "shards", count=args.shards, samples=500, size=1024)
        with ShardServer(work / "shards", delay=args.latency) as server:
            plain = fetches(server, work, args.readers, disable=True)
            shared = fetches(server, work, args.readers, disable=False)
            rates = warm(server, work, args.runs, args.epochs)
            counted = warm_instructions(server, work, min(args.shards, 2))
    result = {
        "readers": args.readers, "shards": args.shards,
        "fetches_per_shard": {"plain": plain, "sharedfs": shared},
        "warm_samples_per_s": rates,
        "warm_ratio": rates["sharedfs"] / rates["plain"],
    }
    if args.json:  # the row schema of benchmarks/run_all.py
        print(json.dumps([
            {"what": f"fetches per shard, {args.readers} readers on one cache (mean)", "sharedfs": shared["mean"],
             "baseline": plain["mean"], "unit": "", "ratio": shared["mean"] / plain["mean"], "goal": "sharedfs = 1.0",
             "met": shared["max"] == 1},
            {"what": "warm-cache samples/s (plain webdataset vs sharedfs)", "sharedfs": rates["sharedfs"],
             "baseline": rates["plain"], "unit": "/s", "ratio": result["warm_ratio"], "goal": ">= 0.97",
             "met": result["warm_ratio"] >= 0.97},
        ] + ([] if counted is None else [
            {"what": f"warm-cache pass over {min(args.shards, 2)} shards, instructions (callgrind), plain webdataset "
                     "vs sharedfs", "sharedfs": counted["sharedfs"], "baseline": counted["plain"], "unit": "instr",
             "ratio": counted["sharedfs"] / counted["plain"], "goal": "<= 1.03",
             "met": counted["sharedfs"] / counted["plain"] <= 1.03,
             "note": f"sharedfs adds {counted['sharedfs'] - counted['plain']:,} instructions (its in-use marker per "
                     "shard opened); system calls are not counted: the samples/s row has them"},
        ]), indent=2))
        return 0
    print(f"webdataset cache, {args.readers} readers on one node, {args.shards} shards of 500 samples")
    print(f"{'measure':<34}{'plain webdataset':>18}{'sharedfs':>12}{'ratio':>9}")
    print(f"{'fetches per shard (mean)':<34}{plain['mean']:>18.2f}{shared['mean']:>12.2f}"
          f"{shared['mean'] / plain['mean']:>9.2f}")
    print(f"{'fetches per shard (max)':<34}{plain['max']:>18d}{shared['max']:>12d}")
    print(f"{'warm-cache samples/s (median)':<34}{rates['plain']:>18.0f}{rates['sharedfs']:>12.0f}"
          f"{result['warm_ratio']:>9.3f}")
    if counted is not None:
        print(f"{'warm pass, instructions':<34}{counted['plain']:>18,}{counted['sharedfs']:>12,}"
              f"{counted['sharedfs'] / counted['plain']:>9.3f}")
    print("goals: sharedfs fetches per shard = 1.0; warm-cache ratio >= 0.97; instructions <= 1.03")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

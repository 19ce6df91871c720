"""The shard cache's fetch path by descriptor against the commit before it: a cached read and a fresh fetch.

Each run opens one already-cached shard ``--reads`` times through ``open_shard`` (in-use marker
written and released, the shard opened and closed), then fetches ``--reads // 4`` new 64 KiB
shards from a local download function (claim, private download directory, rename into the
cache).  Runs alternate between this checkout and sharedfs at ``--before`` (extracted with
``git archive``), so drift on a shared machine hits both alike; medians per operation and
their ratio.

    python benchmarks/shardcache_descriptors.py [--before ed2185e] [--runs 5] [--reads 400]
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

ROOT = Path(__file__).resolve().parent.parent

RUN = textwrap.dedent("""
    import json, os, sys, tempfile, time
    from sharedfs.shardcache import open_shard
    reads = int(sys.argv[1])
    cache = os.path.join(tempfile.mkdtemp(dir=sys.argv[2]), "cache")
    os.mkdir(cache)
    data = os.urandom(64 << 10)
    def download(path):
        with open(path, "wb") as out:
            out.write(data)
    def read(name):
        stream, marker = open_shard(os.path.join(cache, name), download)
        stream.close()
        marker.release()
    read("warm.tar")
    start = time.perf_counter()
    for _ in range(reads):
        read("warm.tar")
    cached = (time.perf_counter() - start) / reads
    start = time.perf_counter()
    for i in range(reads // 4):
        read(f"new-{i}.tar")
    fresh = (time.perf_counter() - start) / (reads // 4)
    print(json.dumps({"cached": cached, "fresh": fresh}))
""")


def before_tree(commit: str, dest: Path) -> dict[str, str]:
    """sharedfs at ``commit`` (package, plugins, shims) first on PYTHONPATH, laid out as a wheel installs it."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "sharedfs", "plugins", "shims",
                              "_sharedfs_bootstrap.py"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    for part in ("plugins", "shims"):
        (dest / part).rename(dest / "sharedfs" / part)
    return {"PYTHONPATH": str(dest)}


def one(env: dict[str, str], reads: int, where: str) -> dict[str, float]:
    full = {**os.environ, "SHAREDFS_STRICT": "1", **env}
    out = subprocess.run([sys.executable, "-c", RUN, str(reads), where], env=full, check=True, capture_output=True,
                         text=True, cwd=where)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="ed2185e2fd999c406fcacbc3f53447ab2c75b146")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--reads", type=int, default=400)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir="/var/tmp" if os.path.isdir("/var/tmp") else None) as tmp:
        sides = {"before": before_tree(args.before, Path(tmp)), "now": {}}
        got: dict[str, dict[str, list[float]]] = {side: {"cached": [], "fresh": []} for side in sides}
        for _ in range(args.runs):
            for side, env in sides.items():
                for op, seconds in one(env, args.reads, tmp).items():
                    got[side][op].append(seconds)
    result = {op: {side: statistics.median(got[side][op]) * 1e6 for side in sides} for op in ("cached", "fresh")}
    for op, median in result.items():
        print(f"{op:6s}: before {median['before']:8.1f} us, now {median['now']:8.1f} us, "
              f"ratio {median['now'] / median['before']:.2f}x")
    print(json.dumps(result))


if __name__ == "__main__":
    main()

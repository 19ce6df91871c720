"""What sharedfs costs a process: interpreter start-up, and the first import of a target.

Two identical venvs (same requirements), one with the sharedfs wheel, one without.
Runs alternate between them so drift (CPU frequency, page cache) hits both alike;
the table reports medians and their ratio, plus the bootstrap's own import time
from ``python -X importtime`` (the part of the difference that is really ours).

    python benchmarks/startup.py [--runs 40] [--json]

Goals (issue 2): ``python -c pass`` <= 1.03x; ``import datasets`` <= 1.05x.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "benchmarks" / ".work"
DATASETS = os.environ.get("SHAREDFS_BENCH_DATASETS", "datasets==5.2.0")


def pip(python: str, *args: str) -> None:
    subprocess.run([python, "-m", "pip", "-q", "--disable-pip-version-check", *args], check=True)


def make(path: Path, *reqs: str) -> str:
    python = str(path / "bin" / "python")
    marker = path / ".reqs"
    if marker.exists() and marker.read_text() == repr(reqs):
        return python  # reuse: the venvs are expensive and the benchmark is about runs, not installs
    venv.EnvBuilder(with_pip=True, clear=True).create(path)
    pip(python, "install", *reqs)
    marker.write_text(repr(reqs))
    return python


def wheel() -> str:
    out = Path(tempfile.mkdtemp())
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(ROOT)], check=True)
    return str(next(out.glob("sharedfs-*.whl")))


def timed(python: str, code: str, env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run([python, "-c", code], check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def alternate(with_sfs: str, without: str, code: str, runs: int, env: dict[str, str]) -> tuple[float, float]:
    a, b = [], []
    timed(with_sfs, code, env), timed(without, code, env)  # warm the page cache for both
    for _ in range(runs):
        a.append(timed(with_sfs, code, env))
        b.append(timed(without, code, env))
    return statistics.median(a), statistics.median(b)


def bootstrap_self_time(python: str, env: dict[str, str]) -> float:
    """Microseconds spent importing sharedfs modules at start-up, from -X importtime (median of 15)."""
    totals = []
    for _ in range(15):
        err = subprocess.run([python, "-X", "importtime", "-c", "pass"], env=env, capture_output=True,
                             text=True).stderr
        totals.append(sum(int(line.split("|")[0].split(":")[1]) for line in err.splitlines()
                          if "sharedfs" in line and line.startswith("import time:")))
    return statistics.median(totals)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHAREDFS_", "PYTHON"))}
    WORK.mkdir(parents=True, exist_ok=True)
    without = make(WORK / "without", DATASETS)
    with_sfs = make(WORK / "with", DATASETS, wheel())
    rows = []
    for what, code, goal in (("python -c pass", "pass", 1.03), ("import datasets", "import datasets", 1.05)):
        a, b = alternate(with_sfs, without, code, args.runs, env)
        rows.append({"what": f"{what} (venv with vs without sharedfs)", "sharedfs": a * 1e3, "baseline": b * 1e3,
                     "unit": "ms", "ratio": a / b, "goal": f"<= {goal}", "met": a / b <= goal})
    self_us = bootstrap_self_time(with_sfs, env)
    rows.append({"what": "sharedfs modules imported at start-up (-X importtime)", "sharedfs": self_us,
                 "baseline": None, "unit": "us", "ratio": None, "goal": "well under 1 ms", "met": self_us < 1000})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'what':<58}{'sharedfs':>12}{'baseline':>12}{'ratio':>8}  goal")
    for row in rows:
        base = f"{row['baseline']:>10.1f}{row['unit']}" if row["baseline"] is not None else f"{'-':>12}"
        ratio = f"{row['ratio']:.3f}" if row["ratio"] is not None else "-"
        print(f"{row['what']:<58}{row['sharedfs']:>10.1f}{row['unit']}{base}{ratio:>8}  {row['goal']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

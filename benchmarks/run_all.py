"""Run every benchmark side by side in one go; write ``results.md`` and ``results.png``.

Each ``benchmarks/<name>.py`` (except this file) is run with ``--json`` and must print a
list of rows::

    {"what": str, "sharedfs": float, "baseline": float | None, "unit": str,
     "ratio": float | None, "goal": str, "met": bool}

``results.md`` gets one table (what, sharedfs, baseline, ratio, goal, machine) and the
machine and versions that produced it; ``results.png`` charts every ratio against its goal.

    python benchmarks/run_all.py [--only NAME] [--timeout 600] [--render]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGES = ("sharedfs", "filelock", "pluggy", "datasets", "huggingface_hub", "webdataset", "wids", "torch",
            "mmengine", "xtuner")


def machine() -> dict[str, str]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            pass
    return {
        "host": f"{platform.machine()}, {os.cpu_count()} CPUs, Linux {platform.release()}",
        "python": platform.python_version(),
        "versions": ", ".join(f"{k} {v}" for k, v in versions.items()),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def run_one(script: Path, timeout: float) -> tuple[list[dict], float, str | None]:
    started = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, str(script), "--json"], capture_output=True, text=True,
                              timeout=timeout, cwd=HERE.parent)
    except subprocess.TimeoutExpired:
        return [], time.monotonic() - started, f"timed out after {timeout:.0f} s"
    took = time.monotonic() - started
    if proc.returncode != 0:
        return [], took, (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
    try:
        rows = json.loads(proc.stdout)
    except ValueError:
        return [], took, "did not print JSON rows"
    return rows, took, None


def fmt(value: float | str | list | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, str):  # already formatted, e.g. "5/5" rounds
        return value
    if isinstance(value, list):  # per-node counts, e.g. preparations on node a / node b
        return " / ".join(str(v) for v in value)
    text = f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return f"{text} {unit}".strip()


def write_markdown(results: dict[str, tuple[list[dict], float, str | None]], info: dict[str, str],
                   path: Path) -> None:
    lines = [
        "# Benchmark results", "",
        f"Produced by `python benchmarks/run_all.py` on {info['date']}.", "",
        f"- machine: {info['host']}",
        f"- Python {info['python']}; {info['versions']}", "",
        "| benchmark | what | sharedfs | baseline | ratio | goal | met |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, (rows, _took, error) in results.items():
        if error:
            lines.append(f"| {name} | FAILED: {error} | | | | | no |")
        for row in rows:
            lines.append(
                f"| {name} | {row['what']} | {fmt(row['sharedfs'], row.get('unit', ''))} | "
                f"{fmt(row.get('baseline'), row.get('unit', ''))} | {fmt(row.get('ratio'))} | {row['goal']} | "
                f"{'yes' if row.get('met') else 'NO'} |"
            )
    lines += ["", "Run times: " + ", ".join(f"{name} {took:.0f} s" for name, (_, took, _) in results.items()), ""]
    path.write_text("\n".join(lines))


def write_chart(results: dict[str, tuple[list[dict], float, str | None]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(f"{name}: {row['what']}", row["ratio"], row.get("met"))
            for name, (items, _, _) in results.items() for row in items if row.get("ratio") is not None]
    if not rows:
        return
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(rows) + 1.2))
    labels = [label if len(label) < 70 else label[:67] + "..." for label, _, _ in rows]
    ax.barh(labels, [ratio for _, ratio, _ in rows], color=["#2a9d8f" if met else "#e76f51" for _, _, met in rows])
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("sharedfs / baseline (1.0 = same; green = goal met)")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", help="run only benchmarks whose file name contains this")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--render", action="store_true", help="only re-render results.md/.png from results.json")
    args = parser.parse_args()
    if args.render:
        saved = json.loads((HERE / "results.json").read_text())
        results = {name: tuple(value) for name, value in saved["results"].items()}
        write_markdown(results, saved["machine"], HERE / "results.md")
        write_chart(results, HERE / "results.png")
        print((HERE / "results.md").read_text())
        return 0
    scripts = sorted(p for p in HERE.glob("*.py") if p.name != "run_all.py" and not p.name.startswith("_"))
    if args.only:
        scripts = [p for p in scripts if any(o in p.name for o in args.only)]
    results = {}
    for index, script in enumerate(scripts, 1):
        print(f"[{index}/{len(scripts)}] {script.stem} ...", flush=True)
        results[script.stem] = run_one(script, args.timeout)
        rows, took, error = results[script.stem]
        print(f"    {'FAILED: ' + error if error else f'{len(rows)} rows'} ({took:.0f} s)", flush=True)
    info = machine()
    # Raw rows first: rendering can then be redone (--render) without rerunning the benchmarks.
    (HERE / "results.json").write_text(json.dumps({"machine": info, "results": results}, indent=2))
    write_markdown(results, info, HERE / "results.md")
    write_chart(results, HERE / "results.png")
    print((HERE / "results.md").read_text())
    return 1 if any(error for _, _, error in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())

"""Run every benchmark side by side in one go; write ``results.json``, ``results.md`` and ``results.png``.

Each ``benchmarks/<name>.py`` (except this file and ``_*.py``) is run with ``--json`` and must
print a list of rows (the schema is in ``_common.py``)::

    {"what": str, "sharedfs": float | ..., "baseline": float | None, "unit": str,
     "ratio": float | None, "goal": str, "met": bool | None,
     "floor": float | None, ...}           # optional: the physical floor, notes, sample counts

``baseline`` is the stock library measured in the same run, ``floor`` what the operation cannot
avoid (its system calls, timed from Python).  The table prints them side by side with the
ratio; ``met`` is computed by each benchmark from its figures (``None``: informational, or a
goal that needs a bigger machine).  ``results.json`` keeps the raw rows, the machine, the
versions and the load average before and after each benchmark; ``--render`` redraws the table
and the chart from it.  ``results.png`` plots each ratio against its goal (and the ratio to the
floor where there is one), for the README.

A benchmark may declare, on a line of its own, ``RUN_ALL_TIMEOUT = <seconds>`` (it needs longer
than ``--timeout``) and ``RUN_ALL_QUICK_ARGS = "<arguments>"`` (what ``--quick`` passes; default
``--quick`` when the script has that option).  Exit status 2 from a benchmark means it cannot
run here (no Slurm, no FUSE, no XTuner stack): it is listed as skipped, not failed.

    python benchmarks/run_all.py [--only NAME] [--quick] [--timeout 900] [--out DIR] [--render] [--strict]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import fmt, met_text  # noqa: E402

PACKAGES = ("sharedfs", "filelock", "pluggy", "datasets", "huggingface_hub", "webdataset", "wids", "torch",
            "mmengine", "xtuner", "pyarrow")
#: Quick arguments for benchmarks that do not declare RUN_ALL_QUICK_ARGS and have no --quick.
QUICK_FALLBACK = {"scale": "--nodes 2 --ranks 2 4 --warmup 1 --window 2"}
SKIPPED = 2  # the exit status of a benchmark that cannot run on this machine


def machine() -> dict[str, Any]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            pass
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), cpu)
    except OSError:
        pass
    try:
        with open("/proc/meminfo") as fh:
            mem = int(next(line.split()[1] for line in fh if line.startswith("MemTotal"))) / 1024 / 1024
    except (OSError, StopIteration):
        mem = 0.0
    tools = {}
    for tool in ("valgrind",):
        try:
            out = subprocess.run([tool, "--version"], capture_output=True, text=True).stdout.strip()
            tools[tool] = out
        except OSError:
            pass
    return {
        "host": f"{platform.machine()}, {os.cpu_count()} CPUs ({cpu}), {mem:.0f} GB, Linux {platform.release()}",
        "python": f"{platform.python_version()} ({platform.python_implementation()})",
        "versions": ", ".join(f"{k} {v}" for k, v in versions.items()),
        "tools": ", ".join(tools.values()),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def _declared(script: Path, name: str) -> str | None:
    found = re.search(rf"^{name} = (.+)$", script.read_text(), re.MULTILINE)
    return found.group(1).strip() if found else None


def timeout_for(script: Path, default: float) -> float:
    """``default``, or longer when the script says it needs longer (a line ``RUN_ALL_TIMEOUT = <seconds>``)."""
    found = _declared(script, "RUN_ALL_TIMEOUT")
    return max(default, float(found)) if found and found.isdigit() else default


def quick_args(script: Path) -> list[str]:
    declared = _declared(script, "RUN_ALL_QUICK_ARGS")
    if declared:
        return shlex.split(declared.strip("\"'"))
    if '"--quick"' in script.read_text():
        return ["--quick"]
    return shlex.split(QUICK_FALLBACK.get(script.stem, ""))


def run_one(script: Path, timeout: float, extra: list[str]) -> dict[str, Any]:
    started = time.monotonic()
    load_before = os.getloadavg()
    result: dict[str, Any] = {"rows": [], "error": None, "skipped": None, "load_before": load_before}
    try:
        proc = subprocess.run([sys.executable, str(script), "--json", *extra], capture_output=True, text=True,
                              timeout=timeout, cwd=HERE.parent)
    except subprocess.TimeoutExpired:
        result["error"] = f"timed out after {timeout:.0f} s"
    else:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        if proc.returncode == SKIPPED:
            result["skipped"] = last
        elif proc.returncode != 0:
            result["error"] = last
        else:
            try:
                result["rows"] = json.loads(proc.stdout)
            except ValueError:
                result["error"] = "did not print JSON rows"
    result["seconds"] = time.monotonic() - started
    result["load_after"] = os.getloadavg()
    return result


def _load(value: Any) -> str:
    return "/".join(f"{x:.2f}" for x in value) if value else "-"


def table_lines(results: dict[str, dict[str, Any]]) -> list[str]:
    lines = ["| benchmark | what | stock | sharedfs | ratio | floor | x floor | goal | met |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, result in results.items():
        if result.get("error"):
            lines.append(f"| {name} | FAILED: {result['error']} | | | | | | | NO |")
        if result.get("skipped"):
            lines.append(f"| {name} | skipped: {result['skipped']} | | | | | | | - |")
        for row in result.get("rows", []):
            unit = row.get("unit", "")
            lines.append(f"| {name} | {row['what']} | {fmt(row.get('baseline'), unit)} | "
                         f"{fmt(row.get('sharedfs'), unit)} | {fmt(row.get('ratio'))} | {fmt(row.get('floor'), unit)} | "
                         f"{fmt(row.get('vs_floor'))} | {row.get('goal', '')} | {met_text(row)} |")
    return lines


def notes_lines(results: dict[str, dict[str, Any]]) -> list[str]:
    lines = []
    for name, result in results.items():
        for row in result.get("rows", []):
            extra = [row.get("note")] if row.get("note") else []
            if row.get("floor_what"):
                extra.append(f"floor: {row['floor_what']}")
            if row.get("samples"):
                spread = f", spread +-{row['spread']:.3f}" if row.get("spread") is not None else ""
                extra.append(f"{row['samples']} runs per side{spread}")
            if extra:
                lines.append(f"- {name}, {row['what']}: " + "; ".join(str(x) for x in extra))
    return lines


#: results.md below this line is written by hand (the summary and what the numbers mean): a new run keeps it.
HAND_WRITTEN = "<!-- written by hand below this line; `make bench` keeps it -->"


def write_markdown(results: dict[str, dict[str, Any]], info: dict[str, Any], path: Path) -> None:
    met = [row.get("met") for r in results.values() for row in r.get("rows", [])]
    lines = [
        "# Benchmark results", "",
        f"Produced by `make bench` (`python benchmarks/run_all.py{' --quick' if info.get('quick') else ''}`) "
        f"on {info['date']}.", "",
        f"- machine: {info['host']}",
        f"- Python {info['python']}; {info['versions']}",
    ]
    if info.get("tools"):
        lines.append(f"- {info['tools']}")
    if info.get("tree"):
        lines.append(f"- sharedfs from {info['tree']} (SHAREDFS_BENCH_TREE)")
    changed = info.get("rerun_versions") or {}
    for name, when in sorted((info.get("rerun") or {}).items()):  # `--merge`: some benchmarks run again later
        lines.append(f"- {name}: run again on {when} (`--only {name} --merge`), after the change it measures"
                     + (f"; with {changed[name]}" if changed.get(name) else ""))
    lines += [
        "- load average (1/5/15 min) before and after each benchmark: "
        + "; ".join(f"{name} {_load(r.get('load_before'))} -> {_load(r.get('load_after'))}" for name, r in results.items()),
        f"- goals met: {sum(1 for m in met if m is True)}, missed: {sum(1 for m in met if m is False)}, "
        f"informational or not applicable here: {sum(1 for m in met if m is None)}",
        "",
        "stock = the framework or filelock without sharedfs (`SHAREDFS_DISABLE=1`, or filelock's own class), "
        "measured in the same run; floor = what the operation cannot avoid, timed from Python; "
        "x floor = sharedfs / floor.", "",
        *table_lines(results), "",
        "Notes:", "", *notes_lines(results), "",
        "Run times: " + ", ".join(f"{name} {r.get('seconds', 0):.0f} s" for name, r in results.items()), "",
    ]
    old = path.read_text() if path.exists() else ""
    kept = HAND_WRITTEN + old.split(HAND_WRITTEN, 1)[1] if HAND_WRITTEN in old else ""
    path.write_text("\n".join(lines) + kept)


def write_chart(results: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(f"{name}: {row['what']}", row) for name, r in results.items() for row in r.get("rows", [])
            if isinstance(row.get("ratio"), (int, float))]
    if not rows:
        return
    floors = [(label, row) for label, row in rows if isinstance(row.get("vs_floor"), (int, float))]
    fig, axes = plt.subplots(1, 2 if floors else 1, figsize=(15 if floors else 10, 0.42 * len(rows) + 1.6),
                             gridspec_kw={"width_ratios": [3, 1]} if floors else None, squeeze=False)
    ax = axes[0][0]
    labels = [label if len(label) < 80 else label[:77] + "..." for label, _ in rows]
    colors = ["#2a9d8f" if row.get("met") else "#e76f51" if row.get("met") is False else "#9e9e9e" for _, row in rows]
    ax.barh(labels, [row["ratio"] for _, row in rows], color=colors)
    for y, (_, row) in enumerate(rows):
        goal = re.search(r"([<>]=)\s*([\d.]+)(?!\s*(?:kB|MB|x floor|s\b))", row.get("goal", ""))
        if goal and "+" not in row.get("goal", ""):
            ax.plot([float(goal.group(2))] * 2, [y - 0.4, y + 0.4], color="black", linewidth=1.5)
    ax.axvline(1.0, color="black", linewidth=0.6, linestyle=":")
    ax.set_xlabel("sharedfs / stock (1.0 = same; bar green = goal met, red = missed, grey = informational; "
                  "black tick = goal)")
    ax.invert_yaxis()
    if floors:
        fx = axes[0][1]
        index = {label: i for i, (label, _) in enumerate(rows)}
        fx.barh([index[label] for label, _ in floors], [row["vs_floor"] for _, row in floors], color="#457b9d")
        fx.set_ylim(ax.get_ylim())
        fx.set_yticks([])
        fx.set_xscale("log")
        fx.set_xlabel("sharedfs / physical floor (log)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def render(results: dict[str, dict[str, Any]], info: dict[str, Any], out: Path) -> None:
    write_markdown(results, info, out / "results.md")
    write_chart(results, out / "results.png")
    print((out / "results.md").read_text())


def _versions_differ(before: str, now: str) -> str:
    """The "name version" items of ``now`` that ``before`` does not list (an upgrade, or a package added)."""
    seen = set(before.split(", "))
    return ", ".join(item for item in now.split(", ") if item not in seen)


def _upgrade(saved: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """results.json of an older run_all (name -> [rows, seconds, error]) in today's shape."""
    results = {}
    for name, value in saved["results"].items():
        if isinstance(value, list):
            rows, took, error = value
            value = {"rows": rows, "seconds": took, "error": error}
        results[name] = value
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", help="run only benchmarks whose file name contains this")
    parser.add_argument("--skip", action="append", default=[], help="skip benchmarks whose file name contains this")
    parser.add_argument("--quick", action="store_true", help="short runs: check that everything works, not final numbers")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per benchmark (see RUN_ALL_TIMEOUT)")
    parser.add_argument("--out", type=Path, default=HERE, help="where results.json/.md/.png go (default: benchmarks/)")
    parser.add_argument("--render", action="store_true", help="only re-render results.md/.png from results.json")
    parser.add_argument("--merge", action="store_true",
                        help="keep the other benchmarks' rows in results.json and replace only those run now")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a goal is missed, not only on failures")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.render:
        saved = json.loads((args.out / "results.json").read_text())
        render(_upgrade(saved), saved["machine"], args.out)
        return 0
    scripts = sorted(p for p in HERE.glob("*.py") if p.name != "run_all.py" and not p.name.startswith("_"))
    if args.only:
        scripts = [p for p in scripts if any(o in p.name for o in args.only)]
    scripts = [p for p in scripts if not any(s in p.name for s in args.skip)]
    results: dict[str, dict[str, Any]] = {}
    for index, script in enumerate(scripts, 1):
        extra = quick_args(script) if args.quick else []
        print(f"[{index}/{len(scripts)}] {script.stem} {' '.join(extra)} (load {os.getloadavg()[0]:.2f}) ...", flush=True)
        result = run_one(script, timeout_for(script, args.timeout), extra)
        results[script.stem] = result
        status = (f"FAILED: {result['error']}" if result["error"] else f"skipped: {result['skipped']}"
                  if result["skipped"] else f"{len(result['rows'])} rows")
        print(f"    {status} ({result['seconds']:.0f} s)", flush=True)
    info = machine()
    info["quick"] = args.quick
    info["tree"] = os.environ.get("SHAREDFS_BENCH_TREE")
    if args.merge and (args.out / "results.json").exists():
        saved = json.loads((args.out / "results.json").read_text())
        rerun = {**(saved["machine"].get("rerun") or {}), **{name: info["date"] for name in results}}
        # A rerun under other package versions says which: the header's versions are the first run's.
        differs = _versions_differ(saved["machine"]["versions"], info["versions"])
        rerun_versions = {**(saved["machine"].get("rerun_versions") or {}), **{name: differs for name in results}}
        results = {**_upgrade(saved), **results}
        info = {**saved["machine"], "rerun": rerun,
                "rerun_versions": {name: text for name, text in rerun_versions.items() if text}}
    # Raw rows first: rendering can be redone (--render) without rerunning the benchmarks.
    (args.out / "results.json").write_text(json.dumps({"machine": info, "results": results}, indent=2))
    render(results, info, args.out)
    failed = any(r["error"] for r in results.values())
    missed = any(row.get("met") is False for r in results.values() for row in r["rows"])
    return 1 if failed or (args.strict and missed) else 0


if __name__ == "__main__":
    sys.exit(main())

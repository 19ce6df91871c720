"""What every benchmark shares: the row schema, alternating runs, the load, instruction counts.

Not a benchmark itself (``run_all.py`` skips files starting with ``_``).  Each benchmark prints,
with ``--json``, a list of rows::

    {"what": str,                 # the measurement, with its unit of work
     "sharedfs": float | ...,     # sharedfs's figure
     "baseline": float | None,    # the stock library's figure, measured in the same run
     "unit": str,
     "ratio": float | None,       # sharedfs / baseline
     "goal": str,                 # e.g. "<= 1.05"; "-" for a row that only informs
     "met": bool | None,          # computed from the figures; None: informational, or the goal
                                  #   does not apply on this machine ("note" says why)
     # optional
     "floor": float | None,       # the physical floor, same unit: the system calls the operation
                                  #   cannot avoid (or the least any implementation pays), timed from Python
     "floor_what": str,           # what the floor is
     "vs_floor": float | None,    # sharedfs / floor
     "samples": int,              # runs per side behind the medians
     "spread": float | None,      # half the interquartile range of the ratio samples (noise)
     "note": str}

Every "met" is computed from the measured figures; every baseline is repeated as often as
sharedfs's figure, in alternating order (ABBA), so drift (CPU frequency, page cache, other
processes) hits both sides alike.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from typing import Any, Callable, Iterable, Sequence

#: Environment variables a child must not inherit from whoever runs the benchmark.
NOISY_ENV = ("SHAREDFS_", "PYTHON", "LD_PRELOAD")


#: ``SHAREDFS_BENCH_TREE=/path/to/a/checkout`` runs the children with that tree's sharedfs first on
#: PYTHONPATH (its ``_sharedfs_bootstrap``, ``sharedfs``, plugins and shims): a candidate change
#: measured against the installed one without installing it.
TREE = os.environ.get("SHAREDFS_BENCH_TREE")


def clean_env(*, drop: Iterable[str] = NOISY_ENV, **extra: object) -> dict[str, str]:
    """This environment without sharedfs settings and interpreter knobs, plus ``extra``."""
    prefixes = tuple(drop)
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    if TREE:
        env["PYTHONPATH"] = TREE
    env.update({k: str(v) for k, v in extra.items()})
    return env


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def at_most(value: float | None, limit: float) -> bool | None:
    return None if value is None else value <= limit


def at_least(value: float | None, limit: float) -> bool | None:
    return None if value is None else value >= limit


def row(what: str, sharedfs: Any, baseline: Any, unit: str, goal: str, met: bool | None, **extra: Any) -> dict:
    """One result row; ``ratio`` and ``vs_floor`` are computed unless given."""
    out: dict[str, Any] = {"what": what, "sharedfs": sharedfs, "baseline": baseline, "unit": unit}
    numeric = isinstance(sharedfs, (int, float)) and isinstance(baseline, (int, float))
    out["ratio"] = extra.pop("ratio", ratio(sharedfs, baseline) if numeric else None)
    out["goal"], out["met"] = goal, (None if met is None else bool(met))
    floor = extra.get("floor")
    if floor is not None and "vs_floor" not in extra and isinstance(sharedfs, (int, float)):
        extra["vs_floor"] = ratio(sharedfs, floor)
    out.update(extra)
    return out


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def half_iqr(values: Sequence[float]) -> float | None:
    """Half the interquartile range: the noise around a median."""
    if len(values) < 4:
        return None
    q = statistics.quantiles(values, n=4)
    return (q[2] - q[0]) / 2


def alternate(first: Callable[[], Any], second: Callable[[], Any], runs: int) -> tuple[list, list]:
    """``runs`` results of each, in ABBA order: neither side always runs first (or on a warmer cache)."""
    a: list = []
    b: list = []
    for i in range(runs):
        if i % 2 == 0:
            a.append(first())
            b.append(second())
        else:
            b.append(second())
            a.append(first())
    return a, b


def paired_ratio(a: Sequence[float], b: Sequence[float]) -> tuple[float, float | None]:
    """Median of the per-pair ratios (each pair ran back to back) and its half-IQR."""
    ratios = [x / y for x, y in zip(a, b) if y]
    return median(ratios), half_iqr(ratios)


def loadavg() -> float:
    return os.getloadavg()[0]


def vm_status(pid: str = "self") -> dict[str, int]:
    """VmRSS, VmHWM, ... of a process in kB (/proc/<pid>/status; not ru_maxrss, which a fork inherits)."""
    out = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("Vm"):
                key, value = line.split(":", 1)
                out[key] = int(value.split()[0])
    return out


# -- instruction counts: repeatable even on a loaded machine ------------------------------------

_COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")


def valgrind() -> str | None:
    return shutil.which("valgrind")


def instructions(argv: Sequence[str], env: dict[str, str] | None = None, cwd: str | None = None,
                 seed: int = 0) -> int | None:
    """User-space instructions ``argv`` executes (valgrind --tool=callgrind), or None without valgrind.

    Counts exclude the kernel's share of system calls: compare them for the Python-level work
    around the calls, and time the calls themselves.  PYTHONHASHSEED is fixed (``seed``) so that
    set and dict layouts, hence the counts, repeat exactly -- but one layout can favour one side:
    a lock cycle counts up to +-1 % apart between seeds, for filelock as for sharedfs, so a close
    comparison takes the median over several seeds.  BLAS/OpenMP use one thread: numpy's idle
    BLAS threads spin, and callgrind counts the spinning.
    """
    tool = valgrind()
    if tool is None:
        return None
    env = dict(os.environ if env is None else env, PYTHONHASHSEED=str(seed), OPENBLAS_NUM_THREADS="1",
               OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    proc = subprocess.run([tool, "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv], env=env, cwd=cwd,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"valgrind {' '.join(argv)} failed:\n{proc.stderr[-2000:]}")
    found = _COLLECTED.findall(proc.stderr)
    return int(found[-1]) if found else None


def per_cycle_instructions(argv: Sequence[str], cycles: tuple[int, int], env: dict[str, str] | None = None,
                           cwd: str | None = None, seed: int = 0) -> float | None:
    """Instructions per cycle of a loop: the difference of two runs of ``argv + [str(n)]`` over their cycles."""
    low = instructions([*argv, str(cycles[0])], env, cwd, seed)
    high = instructions([*argv, str(cycles[1])], env, cwd, seed)
    if low is None or high is None:
        return None
    return (high - low) / (cycles[1] - cycles[0])


# -- output -------------------------------------------------------------------------------------


def fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return " / ".join(str(v) for v in value)
    text = f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return f"{text} {unit}".strip()


def met_text(row: dict) -> str:
    if row.get("met") is None:
        return "-" if row.get("goal") in (None, "-", "") else "n/a"
    return "yes" if row["met"] else "NO"


def table(rows: list[dict], title: str = "") -> str:
    """Plain-text table: what, stock, sharedfs, ratio, floor, x floor, goal, met."""
    head = ("what", "stock", "sharedfs", "ratio", "floor", "x floor", "goal", "met")
    body = [(r["what"], fmt(r.get("baseline"), r.get("unit", "")), fmt(r.get("sharedfs"), r.get("unit", "")),
             fmt(r.get("ratio")), fmt(r.get("floor"), r.get("unit", "")), fmt(r.get("vs_floor")), r.get("goal", ""),
             met_text(r)) for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    widths[0] = min(widths[0], 90)
    lines = [title] if title else []
    for line in (head, *body):
        cells = [str(c)[:widths[0]] if i == 0 else str(c) for i, c in enumerate(line)]
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))))
        notes = [r.get("note") for r in rows if r["what"] == line[0] and r.get("note")]
        if notes:
            lines.append("    note: " + notes[0])
    return "\n".join(lines)


def emit(rows: list[dict], as_json: bool, title: str = "") -> int:
    """Print the rows as JSON (for run_all.py) or as a table; the exit code is 0 either way."""
    if as_json:
        print(json.dumps(rows, indent=2))
    else:
        print(table(rows, title))
        print(f"(load average {loadavg():.2f} at the end; {os.cpu_count()} CPUs)")
    return 0


def log(message: str) -> None:
    """Progress on stderr (stdout carries the JSON rows)."""
    print(message, file=sys.stderr, flush=True)

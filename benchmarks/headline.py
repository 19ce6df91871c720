"""The README's one benchmark chart: sharedfs against the stock libraries on the figures users notice.

    python benchmarks/headline.py     # benchmarks/results.json -> benchmarks/headline.png

Each bar is one row of ``make bench``'s results (benchmarks/results.md has every row, its goal and
the notes): sharedfs's time, memory or work divided by the stock library's in the same run, so 1.0
is "the same" and lower is better.  Nothing here is measured anew.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

#: (label on the chart, benchmark, the start of its row's "what"), in the order shown.
HEADLINE = (
    ("Python start-up (python -c pass)", "startup", "python -c pass, python -m venv (pip, setuptools), with"),
    ("first import datasets", "startup", "first import: datasets (`import datasets`), sharedfs"),
    ("first import torch", "startup", "first import: torch (`import torch`), sharedfs"),
    ("uncontended lock, local disk", "locks", "uncontended acquire+release, local disk"),
    ("warm load_dataset + cached map", "datasets_load", "warm load_dataset + cached map, local disk"),
    ("8 processes prepare one dataset cache", "datasets_load", "cold prepare: 8 processes with sharedfs"),
    ("memory of a datasets process", "memory", "resident set: datasets"),
    ("webdataset: downloads per shard, 8 readers", "webdataset_cache", "fetches per shard, 8 readers"),
)


def headline_rows(results: dict[str, Any]) -> list[tuple[str, float]]:
    """(label, sharedfs / stock) for each headline figure, from results.json's ``results``."""
    rows = []
    for label, bench, what in HEADLINE:
        (row,) = [r for r in results[bench]["rows"] if str(r.get("what", "")).startswith(what)]
        rows.append((label, float(row["ratio"])))
    return rows


def write(results_json: Path, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(results_json.read_text())
    rows = headline_rows(data["results"])
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.2))
    labels = [label for label, _ in rows][::-1]
    ratios = [ratio for _, ratio in rows][::-1]
    colors = ["#2e7d32" if r <= 1.0 else "#9e9e9e" for r in ratios]
    ax.barh(labels, ratios, color=colors)
    ax.axvline(1.0, color="black", linewidth=1)
    for y, ratio in enumerate(ratios):
        ax.text(ratio + 0.02, y, f"{ratio:.2f}", va="center", fontsize=9)
    ax.set_xlim(0, max(1.3, max(ratios) + 0.15))
    ax.set_xlabel("sharedfs / stock library, same run (1.0 = the same; lower is better)")
    ax.set_title("sharedfs against the stock libraries (make bench)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    write(HERE / "results.json", HERE / "headline.png")
    sys.exit(0)

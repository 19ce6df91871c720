"""The README's first screens are for users; the benchmark detail lives in benchmarks/results.md.

Before: the quick start began at `cd sharedfs` with no clone line, and the README's benchmark section
was a 20-row table and two screens of maintainers' notes.  Now its first screen has the clone line
and the two set-up commands (`make demo`, `make test`); its benchmark section is one headline chart,
drawn from ``make bench``'s results; and the notes moved to results.md, below a line that a new
``make bench`` keeps.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))

import headline  # noqa: E402
import run_all  # noqa: E402


def _section(text: str, heading: str) -> str:
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def test_the_first_screen_has_the_clone_line_and_both_setup_commands() -> None:
    first = README.read_text().split("\n## The errors this fixes\n", 1)[0]
    assert len(first.splitlines()) <= 45  # one screen
    assert "git clone " in first
    assert "`make demo`" in first and "`make test`" in first


def test_the_benchmark_section_is_one_headline_chart() -> None:
    section = _section(README.read_text(), "Benchmarks")
    assert section.count("![") == 1 and "](benchmarks/headline.png)" in section
    assert len(section.strip().splitlines()) <= 15
    assert "[benchmarks/results.md](benchmarks/results.md)" in section
    assert (BENCH / "headline.png").stat().st_size > 1000


def test_the_headline_figures_are_rows_of_the_results() -> None:
    results = json.loads((BENCH / "results.json").read_text())["results"]
    rows = headline.headline_rows(results)
    assert len(rows) == len(headline.HEADLINE) and all(ratio > 0 for _, ratio in rows)


def test_the_chart_renders_and_make_bench_keeps_the_notes(tmp_path: Path) -> None:
    data = json.loads((BENCH / "results.json").read_text())
    headline.write(BENCH / "results.json", tmp_path / "headline.png")
    assert (tmp_path / "headline.png").stat().st_size > 1000
    # results.md: everything below the hand-written line survives a new run's table
    shipped = (BENCH / "results.md").read_text()
    assert run_all.HAND_WRITTEN in shipped and "## Summary and what the numbers mean" in shipped
    out = tmp_path / "results.md"
    out.write_text("an old table\n" + shipped[shipped.index(run_all.HAND_WRITTEN):])
    run_all.write_markdown(data["results"], data["machine"], out)
    text = out.read_text()
    assert "an old table" not in text and text.startswith("# Benchmark results")
    assert text.endswith(shipped[shipped.index(run_all.HAND_WRITTEN):])

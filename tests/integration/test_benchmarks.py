"""The benchmarks report what they measured: computed goals, repeated baselines, one row schema.

``make bench`` (benchmarks/run_all.py) produces the README's numbers; these tests keep its
machinery honest without running the long measurements: no "met" is a constant, the table and
the chart render from rows (old and new results.json alike), and the quick runs of the cheap
benchmarks print rows of the schema ``benchmarks/_common.py`` documents.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import _common  # noqa: E402
import run_all  # noqa: E402

SCHEMA = {"what": str, "unit": str, "goal": str}


def check_rows(rows: list[dict]) -> None:
    assert rows and isinstance(rows, list)
    for row in rows:
        for key, kind in SCHEMA.items():
            assert isinstance(row[key], kind), (key, row)
        assert "sharedfs" in row and "baseline" in row and "ratio" in row, row
        assert row["met"] in (True, False, None), row
        if row["goal"] in ("-", ""):
            assert row["met"] is None, f"a row without a goal cannot be met or missed: {row}"
        for key in ("ratio", "floor", "vs_floor"):
            assert row.get(key) is None or isinstance(row[key], (int, float)), (key, row)


def test_no_benchmark_hard_codes_a_result() -> None:
    # A "met" must come from the figures; slurm.py once wrote "met": True unconditionally.
    for script in BENCH.glob("*.py"):
        text = script.read_text()
        assert not re.search(r"""["']met["']\s*:\s*(True|False)\b""", text), f"{script.name} hard-codes a goal"
        assert not re.search(r"""\bmet\s*=\s*(True|False)\b""", text), f"{script.name} hard-codes a goal"


def test_row_computes_ratio_and_distance_to_the_floor() -> None:
    made = _common.row("x", 12.0, 10.0, "us", "<= 1.2", _common.at_most(1.2, 1.2), floor=4.0)
    assert made["ratio"] == pytest.approx(1.2) and made["vs_floor"] == pytest.approx(3.0) and made["met"] is True
    assert _common.row("x", "1/1", "0/1", "", "every round", True)["ratio"] is None
    assert _common.row("x", 1.0, None, "s", "-", None)["met"] is None
    assert _common.at_most(None, 1.0) is None and _common.at_least(2.0, 1.0) is True


def test_alternate_runs_both_sides_equally_often_in_abba_order() -> None:
    calls: list[str] = []
    a, b = _common.alternate(lambda: calls.append("a") or 1, lambda: calls.append("b") or 2, 4)
    assert calls == ["a", "b", "b", "a", "a", "b", "b", "a"] and len(a) == len(b) == 4
    ratio, spread = _common.paired_ratio([2.0, 2.0, 3.0, 2.0], [1.0, 2.0, 3.0, 1.0])
    assert ratio == pytest.approx(1.5) and spread is not None


def test_vm_status_reads_this_process(tmp_path: Path) -> None:
    status = _common.vm_status()
    assert status["VmRSS"] > 0 and status["VmHWM"] >= status["VmRSS"]


def _results() -> dict:
    rows = [
        _common.row("uncontended flock", 120.0, 125.0, "us", "<= 1.0, and <= 3x floor", False, floor=5.0,
                    floor_what="open + flock + flock(LOCK_UN) + close", samples=9, spread=0.01, note="a note"),
        _common.row("informational", 4.4, None, "ms", "-", None),
        _common.row("needs more cores", 1.5, 1.0, "s", "<= 1.2 on >= 8 cores", None, note="2 cores here"),
    ]
    return {"locks": {"rows": rows, "error": None, "skipped": None, "seconds": 3.0, "load_before": [0.5, 0.4, 0.3],
                      "load_after": [0.9, 0.5, 0.3]},
            "slurm": {"rows": [], "error": None, "skipped": "no Slurm here", "seconds": 1.0},
            "scale": {"rows": [], "error": "timed out after 10 s", "skipped": None, "seconds": 10.0}}


def test_run_all_renders_table_notes_and_chart(tmp_path: Path) -> None:
    info = {"host": "test", "python": "3", "versions": "", "date": "today", "tools": ""}
    run_all.render(_results(), info, tmp_path)
    text = (tmp_path / "results.md").read_text()
    assert "| locks | uncontended flock | 125 us | 120 us | 0.96 | 5 us | 24 | <= 1.0, and <= 3x floor | NO |" in text
    assert "| locks | informational | - | 4.4 ms | - | - | - | - | - |" in text
    assert "| locks | needs more cores | 1 s | 1.5 s | 1.5 | - | - | <= 1.2 on >= 8 cores | n/a |" in text
    assert "skipped: no Slurm here" in text and "FAILED: timed out" in text
    assert "locks 0.50/0.40/0.30 -> 0.90/0.50/0.30" in text
    assert "floor: open + flock" in text and "9 runs per side" in text
    assert (tmp_path / "results.png").stat().st_size > 1000


def test_run_all_rerenders_an_old_results_json(tmp_path: Path) -> None:
    old = {"machine": {"host": "h", "python": "3.11", "versions": "", "date": "d"},
           "results": {"locks": [[{"what": "w", "sharedfs": 1.0, "baseline": 1.0, "unit": "us", "ratio": 1.0,
                                   "goal": "<= 1.2", "met": True}], 2.0, None]}}
    (tmp_path / "results.json").write_text(json.dumps(old))
    out = subprocess.run([sys.executable, str(BENCH / "run_all.py"), "--render", "--out", str(tmp_path)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "| locks | w | 1 us | 1 us | 1 | - | - | <= 1.2 | yes |" in (tmp_path / "results.md").read_text()


def test_run_all_finds_each_benchmarks_timeout_and_quick_arguments() -> None:
    assert run_all.timeout_for(BENCH / "scale.py", 60) >= 60
    assert run_all.quick_args(BENCH / "locks.py") == ["--quick"]
    assert run_all.quick_args(BENCH / "scale.py")  # scale.py has its own knobs


@pytest.mark.long
@pytest.mark.slow
def test_quick_memory_leak_check_prints_schema_rows() -> None:
    out = subprocess.run([sys.executable, str(BENCH / "memory.py"), "--json", "--no-rss", "--cycles", "2000"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    check_rows(rows)
    assert all(row["sharedfs"] == 0 for row in rows if "descriptors" in row["what"])


@pytest.mark.slow
def test_quick_lock_benchmark_prints_schema_rows_with_floors() -> None:
    out = subprocess.run([sys.executable, str(BENCH / "locks.py"), "--json", "--quick", "--no-callgrind"],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    check_rows(rows)
    floors = [row for row in rows if row.get("floor") is not None]
    assert len(floors) == 2 and all(0 < row["floor"] < row["sharedfs"] for row in floors)


@pytest.mark.slow
def test_quick_triton_benchmark_prints_schema_rows() -> None:
    pytest.importorskip("triton")
    out = subprocess.run([sys.executable, str(BENCH / "triton_cache.py"), "--json", "--quick"],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    check_rows(rows)
    assert rows[0]["baseline"] > 0 and rows[0]["sharedfs"] > 0 and rows[0]["samples"] == 2, rows

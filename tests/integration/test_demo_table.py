"""The docs' demo table and the README's demo output list exactly the scenarios the demo runs.

One source, :data:`sharedfs.demo.scenarios.SCENARIOS`: docs/index.md's table is generated from it
(scripts/demo_table.py) and the README's measured output must name the same scenarios, in order, and
count them the same.  Before, docs/index.md had its own hand-written table that disagreed with the
README (68 of 80 lost vs 52, 8 ranks vs 6, 10 rows vs 11 scenarios).
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from sharedfs.demo.scenarios import SCENARIOS

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
INDEX = ROOT / "docs" / "index.md"


def _generator():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("demo_table", ROOT / "scripts" / "demo_table.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_docs_table_is_the_demos_scenario_list() -> None:
    generator = _generator()
    shown = generator.current(INDEX.read_text())
    assert shown == generator.block(), "docs/index.md's demo table is stale: run python scripts/demo_table.py --write"
    rows = [line for line in shown.splitlines() if line.startswith("| ")][2:]
    assert [row.split(" | ")[0][2:] for row in rows] == [scenario.name for scenario in SCENARIOS]


def test_the_readmes_demo_output_names_the_same_scenarios() -> None:
    section = README.read_text().split("\n## What `sharedfs demo` shows\n", 1)[1].split("\n## ", 1)[0]
    output = section.split("```text\n", 1)[1].split("```", 1)[0]
    names = [line.split("  [", 1)[0] for line in output.splitlines()
             if line and not line.startswith(" ") and "  [" in line]
    assert names == [scenario.name for scenario in SCENARIOS]
    count = len(SCENARIOS)
    assert re.search(rf"^{count} of {count} field failures that ran here were reproduced and fixed$", output, re.M)

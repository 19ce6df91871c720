"""The frameworks' own test suites, without and with sharedfs: the counts for results.md.

Runs ``tests/upstream/run.py`` (filelock's, datasets', huggingface_hub's, webdataset's and wids'
own tests from their sdists at the installed or pinned releases, each suite once with
``SHAREDFS_DISABLE=1`` and once with sharedfs active and ``SHAREDFS_STRICT=1``) and turns its
summary into one row per suite: tests passed in each mode, goal "the same failing set" (no test
fails only with sharedfs, none only without).  The note gives selected / passed / failed /
skipped / deselected per mode; tests/upstream/deselect.txt gives the reason for each deselection.
CI runs the same script on every change (.ci/run); this puts its counts in results.md.

    python benchmarks/upstream.py [--json] [--only filelock]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import log, row

RUN_ALL_TIMEOUT = 2400
RUNNER = Path(__file__).resolve().parent.parent / "tests" / "upstream" / "run.py"


def _short(module: str) -> str:
    """A test module by its file name, a directory of them (filelock >= 4.3's tests/core) as ``core/``."""
    name = module.rstrip("/").rsplit("/", 1)[-1]
    return name if name.endswith(".py") else f"{name}/"


def suite_rows(summary: dict) -> list[dict]:
    rows = []
    for suite in summary["suites"]:
        name = f"{suite['suite']} {suite.get('version')}"
        if suite["status"] == "no-tests":  # nothing upstream ships can run: the goal does not apply
            rows.append(row(f"{name}: {suite.get('problem')}", None, None, "tests", "same failing set", None,
                            ratio=None, note="its integration tests run instead (tests/integration/test_mmengine.py "
                                             "and the compatibility matrix)" if suite["suite"] == "mmengine" else ""))
            continue
        if "counts" not in suite or suite["status"] not in ("same", "differ"):
            rows.append(row(f"{name}: its own tests could not run ({suite.get('problem')})", None, None, "tests",
                            "same failing set", suite.get("status") == "same", ratio=None))
            continue
        counts = suite["counts"]
        only_with = [entry["id"] for entry in suite.get("only_with_sharedfs", [])]
        only_without = [entry["id"] for entry in suite.get("only_without_sharedfs", [])]
        per_mode = "; ".join(
            f"{label}: {c['selected']} selected, {c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped, "
            f"{c['deselected']} deselected"
            for label, c in (("without sharedfs", counts["baseline"]), ("with sharedfs", counts["sharedfs"])))
        note = (f"{per_mode}; failing in both modes: {len(suite.get('failing_in_both', []))}; fail only with "
                f"sharedfs: {', '.join(only_with) or 'none'}; only without: {', '.join(only_without) or 'none'}"
                + (f"; flaky (not counted): {len(suite['flaky'])}" if suite.get("flaky") else ""))
        rows.append(row(f"{name}: its own tests ({', '.join(_short(m) for m in suite.get('modules', []))}), "
                        f"tests passed", counts["sharedfs"]["passed"], counts["baseline"]["passed"],
                        "tests", "same failing set", suite["status"] == "same", ratio=None,
                        note=note + f"; what they exercise: {suite.get('why', '')}"))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--only", action="append", help="one suite (repeatable), as tests/upstream/run.py --only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sharedfs-bench-upstream-") as work:
        results = Path(work) / "upstream.json"
        cmd = [sys.executable, str(RUNNER), "--results", str(results)]
        for name in args.only or []:
            cmd += ["--only", name]
        log("the frameworks' own test suites, without and with sharedfs (tests/upstream/run.py) ...")
        done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if not results.exists():
            tail = "\n".join(done.stderr.strip().splitlines()[-5:])
            raise SystemExit(f"tests/upstream/run.py exited {done.returncode} without a summary:\n{tail}")
        summary = json.loads(results.read_text())
    rows = suite_rows(summary)
    if args.json:
        print(json.dumps(rows))
    else:
        for r in rows:
            print(f"{r['what']}: {r['baseline']} / {r['sharedfs']} ({'met' if r['met'] else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Helpers for lock tests: run lock workers on simulated nodes and count overlapping holds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from helpers.env import clean_env

WORKER = str(Path(__file__).with_name("lockworker.py"))


def run_workers(directory: Path, nodes: dict[str, int], iterations: int, which: str = "sharedfs",
                env: dict[str, str] | None = None, timeout: float = 300) -> tuple[int, int, set[str]]:
    """Start ``nodes[node]`` workers per simulated node; return (counter value, overlaps, kinds used)."""
    counter = directory / "counter"
    procs = []
    for node, count in nodes.items():
        for index in range(count):
            out = directory.parent / f"out-{node}-{index}.json"
            worker_env = clean_env({"SHAREDFS_NODE_ID": node, **(env or {})})
            procs.append((out, subprocess.Popen(
                [sys.executable, WORKER, str(directory / "work.lock"), str(counter), str(iterations), which, str(out)],
                env=worker_env, stderr=subprocess.PIPE, text=True)))
    intervals, kinds = [], set()
    for out, proc in procs:
        _, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, err
        data = json.loads(out.read_text())
        intervals += data["intervals"]
        kinds.add(data["kind"])
    return int(counter.read_text()), count_overlaps(intervals), kinds


def count_overlaps(intervals: list[tuple[float, float]]) -> int:
    ordered = sorted(intervals)
    return sum(1 for (_, end), (start, _) in zip(ordered, ordered[1:]) if start < end)

"""The rank processes of a multi-rank test: each trial started on every rank at once, their JSON lines collected.

A rank program (``sharedfs.demo.remotecode``, ``modupdateworker.py``) touches ``SYNC/ready-<trial>-<rank>``
when it is ready for a trial, waits for ``SYNC/go-<trial>``, and prints one JSON line per trial.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: How long the ranks may take to get ready for a trial, or to finish.
RANK_TIMEOUT = 300.0


def wait_for_files(sync: Path, pattern: str, count: int, ranks: Sequence[subprocess.Popen[str]], what: str,
                   deadline: float) -> None:
    """Until ``count`` files match ``pattern`` in ``sync``; fails when a rank died without its file, or at ``deadline``."""
    while len(list(sync.glob(pattern))) < count:
        died = [rank for rank in ranks if rank.poll() not in (None, 0)]
        assert not died, [rank.communicate() for rank in died]
        assert time.monotonic() < deadline, f"{what}: {len(list(sync.glob(pattern)))} of {count} after the wait"
        time.sleep(0.01)


def go(sync: Path, ranks: Sequence[subprocess.Popen[str]], trial: int) -> float:
    """Start ``trial`` on every rank at once, when all are ready; the deadline of the trial's waits."""
    deadline = time.monotonic() + RANK_TIMEOUT
    wait_for_files(sync, f"ready-{trial}-*", len(ranks), ranks, "ranks ready", deadline)
    (sync / f"go-{trial}").touch()
    return deadline


def results(ranks: Sequence[subprocess.Popen[str]], trials: int, timeout: float = RANK_TIMEOUT) -> list[Any]:
    """Every rank's JSON lines, ``trials`` from each (in rank order)."""
    collected = []
    for rank in ranks:
        out, err = rank.communicate(timeout=timeout)
        lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        assert len(lines) == trials, err[-3000:]
        collected += lines
    return collected


def end(ranks: Sequence[subprocess.Popen[str]]) -> None:
    """Kill the ranks still running (a failed test's)."""
    for rank in ranks:
        if rank.poll() is None:
            rank.kill()
            rank.wait()

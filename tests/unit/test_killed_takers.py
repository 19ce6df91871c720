"""A process SIGKILLed at any step of taking or breaking an existence marker never stalls the next taker.

The chaos drill (tests/integration/test_chaos.py) once stalled for the rest of its run: a worker
was killed at the one instant that leaves state nobody can attribute (a marker created empty, or
a breaker's turn file), and waiters had to sit out a 30 s grace period.  Here each such instant is
hit exactly: the worker kills itself from an audit hook at the named step (``sys.addaudithook``
sees ``os.link`` and ``os.remove`` before they run), and a fresh process must get the lock within
seconds and leave no stray file behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from helpers import clean_env

DIE_AT = textwrap.dedent("""
    import os, re, signal, sys
    event, pattern, lock_file, kind = sys.argv[1:5]

    def hook(name, args):
        if name == event and re.search(pattern, str(args[0])):
            os.kill(os.getpid(), signal.SIGKILL)

    import sharedfs
    lock = sharedfs.lock(lock_file, kind=kind, timeout=60)
    sys.addaudithook(hook)
    lock.acquire()
    if pattern == "-":  # hold the lock and die holding it
        os.kill(os.getpid(), signal.SIGKILL)
    print("acquired without being killed", flush=True)
""")

TAKE = textwrap.dedent("""
    import sys, time, sharedfs
    lock = sharedfs.lock(sys.argv[1], kind=sys.argv[2], timeout=float(sys.argv[3]))
    started = time.monotonic()
    with lock:
        print(round(time.monotonic() - started, 3))
""")


def die_at(lock_file: Path, kind: str, event: str, pattern: str) -> None:
    run = subprocess.run([sys.executable, "-c", DIE_AT, event, pattern, str(lock_file), kind], env=clean_env(),
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == -9, (run.returncode, run.stdout, run.stderr)  # it died where it was told to


def take(lock_file: Path, kind: str, timeout: float = 25.0) -> float:
    run = subprocess.run([sys.executable, "-c", TAKE, str(lock_file), kind, str(timeout)], env=clean_env(),
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return float(run.stdout.split()[-1])


def test_a_taker_killed_between_linking_its_record_and_removing_its_own_name(tmp_path: Path) -> None:
    lock_file = tmp_path / "a.lock"
    die_at(lock_file, "soft", "os.remove", r"\.held\.[0-9a-f]{8}$")
    names = sorted(p.name for p in tmp_path.iterdir())
    assert "a.lock.held" in names and any(n.startswith("a.lock.held.") for n in names), names  # the dead taker's state
    assert take(lock_file, "soft") < 5.0
    assert sorted(p.name for p in tmp_path.iterdir()) == [], sorted(p.name for p in tmp_path.iterdir())


def test_a_taker_killed_before_linking_leaves_the_lock_free(tmp_path: Path) -> None:
    lock_file = tmp_path / "a.lock"
    die_at(lock_file, "soft", "os.link", r"\.held\.[0-9a-f]{8}$")
    assert not (tmp_path / "a.lock.held").exists()  # never an empty marker
    assert take(lock_file, "soft") < 1.0


def test_a_breaker_killed_during_its_turn_does_not_stall_the_next(tmp_path: Path) -> None:
    lock_file = tmp_path / "a.lock"
    die_at(lock_file, "soft", "-", "-")  # a holder dies holding the lock
    assert (tmp_path / "a.lock.held").exists()
    die_at(lock_file, "soft", "os.remove", r"a\.lock\.held$")  # the breaker dies just before removing its marker
    assert (tmp_path / "a.lock.held.break").exists()
    started = time.monotonic()
    waited = take(lock_file, "soft")
    assert waited < 5.0, f"the next taker waited {waited:.1f} s for a dead breaker's turn"
    assert time.monotonic() - started < 20
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_marker_on_a_filesystem_without_hard_links_is_still_created_with_its_record(tmp_path: Path) -> None:
    """The fallback: O_EXCL and a write, as before (a filesystem that refuses link(2) with EPERM)."""
    from sharedfs.locks import _marker
    from sharedfs.model.records import HolderRecord

    marker = str(tmp_path / "x.lock.held")
    record = HolderRecord.mine("n1", "soft")
    _marker._NO_LINKS.add(str(tmp_path))
    try:
        fd = _marker.create(marker, record, 0o644)
    finally:
        _marker._NO_LINKS.discard(str(tmp_path))
    os.close(fd)
    seen = _marker.read(marker)
    assert seen is not None and seen.record == record
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.lock.held"]

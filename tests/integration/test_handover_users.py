"""The last holder's record when another user's holder cannot write it: replaced, never left to speak for it.

``<lock>.last`` says which node held the lock last (docs/api.md, "What the next holder sees"); the
next holder skips the cache wait when that is its own node.  In a directory several users share,
the record may be another user's file without group write.  A real throwaway user (bob, node b)
holds the lock after root (node a) wrote that record 0644: bob cannot open it for writing (shown
first: the record would still name node a, and a later holder on node a would skip its wait and
read what bob replaced through its stale cache).  His release replaces the file with one of his own
naming node b, so root's next acquisition on node a waits out the cache.
"""

from __future__ import annotations

import shutil
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from helpers import clean_env, unixusers

import sharedfs
from sharedfs.locks import _handover

CHECKOUT = str(Path(sharedfs.__file__).resolve().parents[1])
SITE = sysconfig.get_paths()["purelib"]

BOB = """
import os, sys
from sharedfs.locks import _handover
lock = sys.argv[1]
try:
    os.close(os.open(lock + ".last", os.O_WRONLY))
    print("writable")
except PermissionError:
    print("denied")
rule = _handover.Handover(lock, 0.5, "node-b", 0o644, 0.05)
rule.arrive()
rule.depart()
"""


def test_a_holder_that_cannot_write_the_record_replaces_it_and_the_next_holder_waits() -> None:
    root = Path(tempfile.mkdtemp(prefix="sharedfs-handover-", dir="/var/tmp"))
    root.chmod(0o777)  # shared by everyone, not sticky: bob may remove root's files here
    lock = root / "x.lock"
    settle = 0.5
    mine = _handover.Handover(str(lock), settle, "node-a", 0o644, 0.05)
    try:
        mine.arrive()
        mine.depart()
        last = lock.with_name("x.lock.last")
        assert last.stat().st_uid == 0 and last.stat().st_mode & 0o777 == 0o644
        with unixusers.throwaway_users(1) as (bob,), unixusers.may_run_this_python(bob, CHECKOUT, SITE):
            done = bob.run([sys.executable, "-c", BOB, str(lock)], env=clean_env({"PYTHONPATH": CHECKOUT}), cwd="/",
                           timeout=120)
            assert done.returncode == 0, done.stderr[-3000:]
            assert done.stdout.split() == ["denied"], done.stdout  # root's record: not his to write
            assert last.stat().st_uid == bob.uid  # his own record took its name
            assert _handover._parse(last.read_bytes(), "last") == _handover._tag("node-b")
            start = time.monotonic()
            mine.arrive()  # node a after node b: waits out the cache
            assert time.monotonic() - start >= settle
            assert _handover.stats["waits"] >= 1
    finally:
        shutil.rmtree(root, ignore_errors=True)

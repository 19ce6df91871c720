"""A taker SIGKILLed before linking its record to the marker leaves ``<lock>.held.<crc>``; waiters collect it.

The record is written under the taker's own name and then hard-linked to ``<lock>.held``
(sharedfs.locks._marker.create).  A taker killed in between leaves the own-name file, and no
process ever uses that name again.  A waiter for the lock now removes such files when their
writer is provably gone (same node, pid gone or reused: the ``sharedfs_holder_alive`` rule), and
never one whose writer nobody can vouch for (another node, no scheduler): that one stays for
``sharedfs locks`` to show as unknown.

Real processes on a FUSE filesystem with 20 ms per metadata operation: a killer watches the
backing directory and SIGKILLs the pid a record names the moment the record is written under its
own name, i.e. between the taker's create and its link.  First a waiter as before (collection off:
both files stay), then sharedfs's own.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from helpers import clean_env

#: SIGKILLs the writer of each x.lock own-name record as soon as the record is in it.
KILLER = textwrap.dedent(r"""
    import json, os, re, signal, sys, time
    directory, stop = sys.argv[1:3]
    own = re.compile(r"x\.lock\.held\.[0-9a-f]{8}\Z")
    done = set()
    print("watching", flush=True)
    while not os.path.exists(stop):
        for entry in os.scandir(directory):
            if entry.name in done or not own.match(entry.name):
                continue
            try:
                with open(entry.path, "rb") as fh:
                    record = json.loads(fh.read() or b"null")
            except (OSError, ValueError):
                continue
            if record:
                os.kill(record["pid"], signal.SIGKILL)
                done.add(entry.name)
        time.sleep(0.001)
""")

TAKE = """
import sys, sharedfs
held = sharedfs.lock(sys.argv[1], kind="soft", timeout=30)
held.acquire()
print("held", flush=True)
sys.stdin.read()
"""

#: Waits for the lock (which a live holder keeps) for a second; "before": without collecting leftovers.
WAIT = """
import sys, sharedfs
from sharedfs.locks import _marker
if sys.argv[2] == "before":
    _marker.collect_leftovers = lambda *args, **kwargs: 0
waiter = sharedfs.lock(sys.argv[1], kind="soft", timeout=1)
try:
    waiter.acquire()
except sharedfs.LockTimeout:
    print("timeout", flush=True)
"""


def _env(node: str) -> dict[str, str]:
    return clean_env({"SHAREDFS_NODE_ID": node})


def _kill_before_link(lock: Path, node: str) -> None:
    done = subprocess.run([sys.executable, "-c", TAKE, str(lock)], env=_env(node), capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == -signal.SIGKILL, (done.returncode, done.stderr[-2000:])


def _own_names(directory: Path) -> dict[str, str]:
    """Own-name files left, by the node their record names."""
    return {json.loads(p.read_bytes())["node"]: p.name for p in directory.glob("x.lock.held.*")}


def _locks_rows(directory: Path) -> dict[str, str]:
    done = subprocess.run([sys.executable, "-m", "sharedfs", "locks", "--json", str(directory)], env=_env("nodeA"),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode in (0, 1), done.stderr
    return {Path(row["file"]).name: f'{row["kind"]}/{row["state"]}' for row in json.loads(done.stdout)}


def _wait(lock: Path, how: str) -> None:
    done = subprocess.run([sys.executable, "-c", WAIT, str(lock), how], env=_env("nodeA"), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "timeout", done.stderr[-2000:]


def test_a_waiter_collects_what_a_taker_killed_before_its_link_left_only_when_its_writer_is_provably_gone(
    hostile_mount,
) -> None:
    mount = hostile_mount("plain", latency_ms=20)
    directory, backing = mount.path / "locks", mount.backing / "locks"
    directory.mkdir()
    lock = directory / "x.lock"
    stop = mount.backing.parent / "stop-killer"
    killer = subprocess.Popen([sys.executable, "-c", KILLER, str(backing), str(stop)], stdout=subprocess.PIPE,
                              text=True, env=clean_env({"SHAREDFS_DISABLE": "1"}))
    try:
        assert killer.stdout is not None and killer.stdout.readline().strip() == "watching"
        _kill_before_link(lock, "nodeA")  # this node: its pid is gone, provably
        _kill_before_link(lock, "nodeB")  # another node, no scheduler: nobody can tell
    finally:
        stop.touch()
        killer.communicate(timeout=30)
    left = _own_names(backing)
    assert sorted(left) == ["nodeA", "nodeB"] and not (backing / "x.lock.held").exists(), left
    assert _locks_rows(directory) == {left["nodeA"]: "own-name/dead", left["nodeB"]: "own-name/unknown"}

    holder = subprocess.Popen([sys.executable, "-c", TAKE, str(lock)], env=_env("nodeA"), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        _wait(lock, "before")
        assert _own_names(backing) == left, "without collection both stay, forever"
        _wait(lock, "sharedfs")
        assert _own_names(backing) == {"nodeB": left["nodeB"]}, "the dead writer's goes, the undecidable one stays"
    finally:
        holder.communicate("", timeout=30)
    assert _locks_rows(directory) == {left["nodeB"]: "own-name/unknown"}

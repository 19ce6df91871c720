"""``sharedfs locks``: who holds what, with real holders (live, SIGKILLed, on "another node", hostile files).

Each test shows the failure first -- what a person with ``ls``, ``cat`` and ``rm`` gets -- and then
that the command does not have it.  Nodes are simulated by ``SHAREDFS_NODE_ID`` (a holder's record
names its node; a process with another node id cannot see its pid), as in tests/unit/test_locks.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from helpers import clean_env

from sharedfs.commands import lockfiles as locks_cmd

HOLD = """
import sys, time, sharedfs
lock = sharedfs.lock(sys.argv[1], kind=sys.argv[2], timeout=30)
lock.acquire()
print("held", flush=True)
time.sleep(3600)
"""

#: A taker killed between writing its record under its own name and linking it to the marker.
KILLED_TAKER = """
import os, sys
from sharedfs.locks import _marker
from sharedfs.model.records import HolderRecord
marker = sys.argv[1] + _marker.SUFFIX
data = HolderRecord.mine("nodeA", "soft").to_bytes()
fd = os.open(_marker.own_name(marker, data), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
os.write(fd, data)
os.kill(os.getpid(), 9)
"""

#: Takes the lock, writes (start, end) of its hold, and leaves; for counting overlapping holds.
TAKE = """
import json, sys, time, sharedfs
lock = sharedfs.lock(sys.argv[1], kind="soft", timeout=float(sys.argv[3]))
try:
    lock.acquire()
except sharedfs.LockTimeout:
    print(json.dumps({"timeout": True}), flush=True)
    sys.exit(0)
start = time.monotonic()
time.sleep(float(sys.argv[2]))
end = time.monotonic()
lock.release()
print(json.dumps({"start": start, "end": end}), flush=True)
"""


def hold(lock: Path, node: str = "nodeA", kind: str = "soft", **env: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(lock), kind], stdout=subprocess.PIPE, text=True,
                            env=clean_env({"SHAREDFS_NODE_ID": node, **env}))
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def killed(lock: Path, node: str = "nodeA") -> None:
    """A holder SIGKILLed while it held ``lock`` (its marker stays)."""
    proc = hold(lock, node)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert Path(f"{lock}.held").exists()


def cli(*args: str, node: str = "nodeA", timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sharedfs", "locks", *args], capture_output=True, text=True,
                          timeout=timeout, env=clean_env({"SHAREDFS_NODE_ID": node, **env}))


def rows(*args: str, node: str = "nodeA", **env: str) -> tuple[list[dict], int]:
    done = cli("--json", *args, node=node, **env)
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout), done.returncode


def by_lock(found: list[dict]) -> dict[str, dict]:
    return {Path(row["file"]).name: row for row in found}


def take(lock: Path, node: str, seconds: float = 0.0, timeout: float = 0.5) -> dict:
    done = subprocess.run([sys.executable, "-c", TAKE, str(lock), str(seconds), str(timeout)], capture_output=True,
                          text=True, timeout=60, env=clean_env({"SHAREDFS_NODE_ID": node}))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


# -- a live holder keeps its lock ------------------------------------------------------------------


def test_a_plain_rm_breaks_a_live_lock_and_the_command_never_does(tmp_path: Path) -> None:
    lock = tmp_path / "a.lock"
    holder = hold(lock)
    try:
        # The failure: `rm -f` of a live holder's marker (what the wait message used to suggest) hands
        # the lock to a second process while the first still holds it.
        os.unlink(f"{lock}.held")
        assert "start" in take(lock, "nodeB")  # a second holder
        holder.kill()
        holder.wait()
        os.unlink(f"{lock}.held") if os.path.exists(f"{lock}.held") else None

        holder = hold(lock)
        found, status = rows(str(tmp_path))
        (row,) = found
        assert (row["lock"], row["kind"], row["state"]) == (str(lock), "marker", "held")
        assert row["holder"]["pid"] == holder.pid and row["holder"]["node"] == "nodeA"
        assert row["holder"]["lock_kind"] == "soft" and row["holder"]["user"]
        assert f"pid {holder.pid} is running on this node" in row["evidence"]
        assert status == locks_cmd.EXIT_HELD
        before = Path(f"{lock}.held").read_bytes()
        cleared = cli("--clear-dead", str(tmp_path))
        assert cleared.returncode == locks_cmd.EXIT_HELD and "removed 0 dead" in cleared.stdout
        assert Path(f"{lock}.held").read_bytes() == before
        assert take(lock, "nodeB") == {"timeout": True}  # still exclusive
    finally:
        holder.kill()
        holder.wait()


# -- a SIGKILLed holder ------------------------------------------------------------------------------


def test_a_killed_holder_is_dead_here_and_cleared_so_a_waiter_on_another_node_proceeds(tmp_path: Path) -> None:
    lock = tmp_path / "b.lock"
    killed(lock, "nodeA")
    # The failure: a waiter on another node cannot see nodeA's pids, so it waits (here: times out).
    assert take(lock, "nodeB") == {"timeout": True}
    # From another node the command says the same, and why, and what would decide it.
    found, status = rows(str(lock), node="nodeB")
    (row,) = found
    assert row["state"] == "unknown" and status == locks_cmd.EXIT_HELD
    assert "ran on node nodeA" in row["evidence"] and "run this command on nodeA" in row["evidence"]
    assert cli("--clear-dead", str(lock), node="nodeB").returncode == locks_cmd.EXIT_HELD
    assert Path(f"{lock}.held").exists()  # unknown is never cleared
    # On the holder's node its death is provable: dead, nothing held (exit 0) ...
    found, status = rows(str(tmp_path), node="nodeA")
    (row,) = found
    assert row["state"] == "dead" and "is gone from this node" in row["evidence"] and status == locks_cmd.EXIT_FREE
    text = cli(str(tmp_path), node="nodeA").stdout
    assert "DEAD" in text and "sharedfs locks --clear-dead PATH" in text
    # ... and --clear-dead removes it, so the waiter on the other node gets the lock.
    done = cli("--clear-dead", "--json", str(tmp_path), node="nodeA")
    assert done.returncode == locks_cmd.EXIT_FREE, done.stderr
    (row,) = json.loads(done.stdout)
    assert row["cleared"] is True and not Path(f"{lock}.held").exists()
    assert "start" in take(lock, "nodeB")


def test_a_taker_killed_before_linking_its_record_leaves_an_own_name_file_that_is_cleared(tmp_path: Path) -> None:
    lock = tmp_path / "c.lock"
    subprocess.run([sys.executable, "-c", KILLED_TAKER, str(lock)], env=clean_env(), check=False)
    (left,) = tmp_path.glob("c.lock.held.*")
    # The failure: the leftover stays forever (nothing else ever removes a name only a dead taker used).
    found, _ = rows(str(tmp_path))
    (row,) = found
    assert (row["kind"], row["state"]) == ("own-name", "dead") and "killed while it created" in row["evidence"]
    assert cli("--clear-dead", str(tmp_path)).returncode == locks_cmd.EXIT_FREE
    assert not left.exists()


# -- another node, no scheduler -------------------------------------------------------------------


def test_a_holder_on_another_node_without_a_scheduler_is_unknown_and_kept(tmp_path: Path) -> None:
    lock = tmp_path / "d.lock"
    holder = hold(lock, "nodeA", PATH="/nonexistent")  # no squeue anywhere: nobody to ask
    try:
        found, status = rows(str(tmp_path), node="nodeB")
        (row,) = found
        assert row["state"] == "unknown" and status == locks_cmd.EXIT_HELD
        assert "names no Slurm job" in row["evidence"] and "ssh nodeA" in row["evidence"]
        text = cli(str(tmp_path), node="nodeB").stdout
        assert "unknown is never cleared" in text
        assert cli("--clear-dead", str(tmp_path), node="nodeB").returncode == locks_cmd.EXIT_HELD
        assert Path(f"{lock}.held").exists()
    finally:
        holder.kill()
        holder.wait()


# -- hostile files ----------------------------------------------------------------------------------


def test_hostile_markers_are_unknown_never_followed_and_never_hang(tmp_path: Path) -> None:
    secret = tmp_path / "elsewhere" / "target"
    secret.parent.mkdir()
    secret.write_text('{"node":"nodeA","pid":1,"acquired_at":1,"kind":"soft"}')  # a record, via a link
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "big.lock.held").write_bytes(b"x" * 100_000)
    (cache / "garbage.lock.held").write_bytes(b"\x00\xffnot json")
    os.mkfifo(cache / "fifo.lock.held")
    os.mkfifo(cache / "pipe.lock")
    (cache / "link.lock.held").symlink_to(secret)
    (cache / "dir.lock.held").mkdir()

    # The failure: what a person's `cat` does with a FIFO -- a blocking open that never returns.
    opened = threading.Event()
    threading.Thread(target=lambda: (open(cache / "fifo.lock.held").close(), opened.set()), daemon=True).start()
    assert not opened.wait(1.0)
    # ... and a symlink at a marker reads as a record of someone else's choosing.
    assert json.loads((cache / "link.lock.held").read_text())["pid"] == 1

    found, status = rows(str(cache))  # bounded by the subprocess timeout: never hangs
    got = by_lock(found)
    for name in ("big.lock.held", "garbage.lock.held", "fifo.lock.held", "link.lock.held", "dir.lock.held",
                 "pipe.lock"):
        assert got[name]["state"] == "unknown", got[name]
        assert got[name]["holder"] is None  # nothing read through the link
    assert "a symlink" in got["link.lock.held"]["evidence"] and "a FIFO" in got["fifo.lock.held"]["evidence"]
    assert status == locks_cmd.EXIT_HELD
    assert cli("--clear-dead", str(cache)).returncode == locks_cmd.EXIT_HELD
    assert os.path.islink(cache / "link.lock.held") and secret.exists() and (cache / "big.lock.held").exists()
    opened.set()
    with open(cache / "fifo.lock.held", "w"):  # lets the blocked reader thread finish
        pass


# -- --clear-dead while waiters arrive -------------------------------------------------------------


def test_a_waiter_that_takes_a_dead_lock_between_the_look_and_the_clear_keeps_it(tmp_path: Path, fresh_runtime,
                                                                                   monkeypatch) -> None:
    monkeypatch.setenv("SHAREDFS_NODE_ID", "nodeA")
    # The failure: `rm` acting on what `ls`/`cat` showed a moment ago.  The holder was dead when
    # looked at; a waiter broke its marker and took the lock since; the `rm` removes the waiter's
    # marker, and a third process takes the lock the waiter still holds.
    first = tmp_path / "first"
    first.mkdir()
    killed(first / "e.lock", "nodeA")
    waiter = hold(first / "e.lock", "nodeA")
    try:
        os.unlink(first / "e.lock.held")
        assert "start" in take(first / "e.lock", "nodeB")  # two holders
    finally:
        waiter.kill()
        waiter.wait()

    # The command: the same look, the same waiter, then the clear.
    lock = tmp_path / "e.lock"
    killed(lock, "nodeA")
    (row,) = [r for _, found in locks_cmd.find([str(tmp_path / "e.lock")], locks_cmd.Walk(progress=False))
              for r in found]
    assert row.state == "dead" and row.seen is not None
    waiter = hold(lock, "nodeA")
    try:
        taken = Path(f"{lock}.held").read_bytes()
        assert locks_cmd.clear(row) is False  # the break turn re-reads: no longer the dead holder's marker
        assert Path(f"{lock}.held").read_bytes() == taken
        assert take(lock, "nodeB") == {"timeout": True}  # the waiter alone holds it
    finally:
        waiter.kill()
        waiter.wait()


def test_clear_dead_removes_exactly_the_dead_while_waiters_arrive_and_no_lock_is_held_twice(tmp_path: Path) -> None:
    live_lock = tmp_path / "live.lock"
    live = hold(live_lock, "nodeA")
    dead_locks = [tmp_path / f"dead{i}.lock" for i in range(4)]
    for lock in dead_locks:
        killed(lock, "nodeA")
    (found, _), live_marker = rows(str(tmp_path)), Path(f"{live_lock}.held").read_bytes()
    assert sorted(r["state"] for r in found) == ["dead"] * 4 + ["held"]

    # Waiters on the holders' node arrive while the clear runs: each takes a lock and holds it a moment.
    waiters = [subprocess.Popen([sys.executable, "-c", TAKE, str(lock), "0.05", "20"], stdout=subprocess.PIPE,
                                text=True, env=clean_env({"SHAREDFS_NODE_ID": "nodeA"}))
               for lock in dead_locks for _ in range(3)]
    done = cli("--clear-dead", "--json", str(tmp_path))
    results = [json.loads(w.communicate(timeout=60)[0]) for w in waiters]
    assert done.returncode == locks_cmd.EXIT_HELD, done.stderr  # the live holder's lock is held
    after = by_lock(json.loads(done.stdout))
    assert after["live.lock.held"]["state"] == "held" and not after["live.lock.held"].get("cleared")
    for lock in dead_locks:  # removed by the clear, or broken first by a waiter (then the waiter's, or gone)
        row = after.get(f"{lock.name}.held")
        assert (row is None or row.get("cleared") is True or row["state"] == "held" or "gone before" in row["evidence"]
                or "taken again" in row["evidence"]), row
        assert row is None or row["state"] != "dead" or row.get("cleared") is True, row  # no dead one left behind
    # Every waiter got its lock, one at a time per lock: never two holders.
    assert all("start" in r for r in results), results
    for index in range(len(dead_locks)):
        spans = sorted((r["start"], r["end"]) for r in results[index * 3:index * 3 + 3])
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:])), spans
    # The live holder keeps its lock: its marker is untouched and nobody else gets it.
    assert Path(f"{live_lock}.held").read_bytes() == live_marker
    assert take(live_lock, "nodeA") == {"timeout": True}
    live.kill()
    live.wait()


# -- input, filters, exit status ------------------------------------------------------------------


def test_bad_input_is_a_clear_error_and_filters_select_rows(tmp_path: Path) -> None:
    missing = cli(str(tmp_path / "nope" / "x.lock"))
    assert missing.returncode == locks_cmd.EXIT_ERROR and "no such file or directory" in missing.stderr
    assert missing.stdout == ""
    negative = cli("--older-than", "-5", str(tmp_path))
    assert negative.returncode == locks_cmd.EXIT_ERROR and "--older-than" in negative.stderr
    lock = tmp_path / "f.lock"
    holder = hold(lock)
    try:
        assert rows("--user", "nobody", str(tmp_path)) == ([], locks_cmd.EXIT_FREE)
        # A misspelt user is an error, not "no lock is held" (it used to answer exit 0 with nothing).
        typo = cli("--user", "nobody-such-user", str(tmp_path))
        assert typo.returncode == locks_cmd.EXIT_ERROR and "no such user" in typo.stderr and typo.stdout == ""
        assert rows("--older-than", "3600", str(tmp_path)) == ([], locks_cmd.EXIT_FREE)
        found, status = rows("--older-than", "0", "--user", str(os.getuid()), str(tmp_path))
        assert len(found) == 1 and status == locks_cmd.EXIT_HELD
        # A lock file nobody holds: free, exit 0; the lock's own path shows it even when free.
        plain = tmp_path / "plain.lock"
        plain.touch()
        found, _ = rows(str(plain))
        assert [(r["kind"], r["state"]) for r in found] == [("native", "free")]
    finally:
        holder.kill()
        holder.wait()


def test_an_empty_path_or_a_path_that_names_nothing_is_an_error_not_a_walk_or_free(tmp_path: Path) -> None:
    """``sharedfs locks ""`` (an unset "$DIR" in a script) walked, and with --clear-dead cleared, the current
    directory with exit 0; ``sharedfs locks /typo`` printed FREE with exit 0."""
    dead = tmp_path / "d.lock"
    holder = hold(dead)
    holder.kill()
    holder.wait()
    for args in (("",), ("--clear-dead", "")):
        done = subprocess.run([sys.executable, "-m", "sharedfs", "locks", *args], capture_output=True, text=True,
                              cwd=tmp_path, env=clean_env({"SHAREDFS_NODE_ID": "nodeA"}), timeout=60)
        assert done.returncode == locks_cmd.EXIT_ERROR, (args, done.stdout, done.stderr)
        assert "empty PATH" in done.stderr and done.stdout == ""
    assert Path(f"{dead}.held").exists()  # nothing was cleared in the current directory
    typo = cli(str(tmp_path / "chekpoints"))
    assert typo.returncode == locks_cmd.EXIT_ERROR and "no such file or directory" in typo.stderr
    # A lock's own name stays answerable when it is free and leaves no file (an existence lock released).
    found, status = rows(str(tmp_path / "free.lock"))
    assert [r["state"] for r in found] == ["free"] and status == locks_cmd.EXIT_FREE


def test_a_native_lock_held_on_this_node_is_held(tmp_path: Path) -> None:
    lock = tmp_path / "n.lock"
    holder = hold(lock, "nodeA", kind="flock")
    try:
        found, status = rows(str(lock))
        kinds = {(r["kind"], r["state"]) for r in found}
        assert ("native", "held") in kinds or ("marker", "held") in kinds, found
        assert status == locks_cmd.EXIT_HELD
    finally:
        holder.kill()
        holder.wait()
    found, status = rows(str(lock))
    assert all(r["state"] == "free" for r in found) and status == locks_cmd.EXIT_FREE


def test_a_native_lock_timeout_names_the_pid_that_holds_it_on_this_node(tmp_path: Path) -> None:
    """A flock LockTimeout used to say only "find it with `fuser -v`"; this node's /proc/locks names the pid."""
    lock = tmp_path / "n.lock"
    holder = hold(lock, "nodeA", kind="flock")
    try:
        done = subprocess.run([sys.executable, "-c", textwrap.dedent("""
            import sys, sharedfs
            try:
                sharedfs.lock(sys.argv[1], kind="flock", timeout=0.2).acquire()
            except sharedfs.LockTimeout as exc:
                print(exc)
        """), str(lock)], capture_output=True, text=True, timeout=60, env=clean_env({"SHAREDFS_NODE_ID": "nodeA"}))
        assert f"pid {holder.pid} (" in done.stdout and "on this node" in done.stdout, done.stdout + done.stderr
        assert f"sharedfs locks {lock}" in done.stdout
    finally:
        holder.kill()
        holder.wait()


# -- a bounded number of filesystem calls ------------------------------------------------------------


def _traced_calls(tree: Path, tmp_path: Path) -> int:
    out = tmp_path / f"strace-{tree.name}"
    subprocess.run(["strace", "-f", "-c", "-o", str(out), "-e", "trace=%file,%desc", sys.executable, "-m",
                    "sharedfs", "locks", str(tree)], capture_output=True, env=clean_env(), timeout=300)
    total = [line for line in out.read_text().splitlines() if line.rstrip().endswith("total")]
    return int(total[-1].split()[3])  # % time, seconds, usecs/call, calls, errors, "total"


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace to count system calls")
def test_ten_thousand_cache_files_cost_a_bounded_number_of_filesystem_calls(tmp_path: Path) -> None:
    def tree(name: str, files: int) -> Path:
        top = tmp_path / name
        for i in range(files):
            directory = top / f"d{i // 100:03d}"
            directory.mkdir(parents=True, exist_ok=True)
            (directory / f"shard-{i:05d}.tar").touch()
        (top / "d000" / "x.lock").touch()
        return top

    small, large = tree("small", 100), tree("large", 10_100)
    per_entry = (_traced_calls(large, tmp_path) - _traced_calls(small, tmp_path)) / 10_000
    # One listing per directory (of 100 files): a few calls per directory, none per plain file.
    assert per_entry < 0.2, per_entry

"""hostilefs profiles and the lock-fault preload behave as named, with real processes.

Every lock/visibility claim is checked from separate processes that carry
their own ``SHAREDFS_NODE_ID``, because that is what the filesystem keys on.
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Callable, Iterator, List

import pytest

# Fixtures; tests/conftest.py also loads the plugin, this keeps the file runnable alone.
from harness.plugin import fault_preload, hostile_mount  # noqa: F401

from sharedfs.demo import (
    FSTYPE,
    NodeProcess,
    RemoteError,
    assert_all_ok,
    is_mounted,
    run_on_nodes,
)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="FUSE/LD_PRELOAD tooling is Linux-only")

LAG_MS = 1000


@pytest.fixture
def node() -> Iterator[Callable[[str], NodeProcess]]:
    """Factory for interactive processes on simulated nodes, closed at teardown."""
    procs: List[NodeProcess] = []

    def factory(node_id: str) -> NodeProcess:
        proc = NodeProcess(node_id)
        procs.append(proc)
        return proc

    yield factory
    for proc in procs:
        proc.close()


def outcome(proc: NodeProcess, code: str, timeout: float = 10.0) -> str:
    """Run ``code`` on ``proc``: "ok", or the errno name (else exception type) it raised."""
    try:
        proc.run(code, timeout=timeout)
        return "ok"
    except RemoteError as exc:
        return errno.errorcode.get(exc.errno, exc.type_name) if exc.errno else exc.type_name


def open_on(procs: List[NodeProcess], path: Path) -> None:
    for proc in procs:
        proc.run(f"import fcntl, os; f = open({str(path)!r}, 'r+')")


# ---------------------------------------------------------------------------
# mount plumbing
# ---------------------------------------------------------------------------


def test_mount_shows_fstype_passes_data_through_and_unmounts(hostile_mount):
    m = hostile_mount("plain")
    entries = [line.split(" - ")[1].split()[:2] for line in open("/proc/self/mountinfo")
               if line.split()[4] == str(m.path)]
    assert entries == [[FSTYPE, "hostilefs-plain"]]

    (m.path / "dir").mkdir()
    (m.path / "dir" / "f.txt").write_text("hello")
    assert (m.backing / "dir" / "f.txt").read_text() == "hello"
    os.rename(m.path / "dir" / "f.txt", m.path / "g.txt")
    assert sorted(os.listdir(m.path)) == ["dir", "g.txt"]

    m.unmount()
    m.unmount()  # idempotent
    assert not is_mounted(m.path)
    assert m.process.returncode == 0, m.log()


def test_unmount_with_a_caller_stuck_in_a_lock_leaves_no_mount(hostile_mount, node):
    m = hostile_mount("localflock")
    (m.backing / "lock").touch()
    holder, waiter = node("a"), node("a")
    open_on([holder, waiter], m.path / "lock")
    holder.run("fcntl.flock(f, fcntl.LOCK_EX)")
    waiter.submit("fcntl.flock(f, fcntl.LOCK_EX)")  # parks a FUSE worker thread
    with pytest.raises(TimeoutError):
        waiter.result(timeout=0.3)
    m.unmount()
    assert not is_mounted(m.path)
    with pytest.raises(RemoteError) as exc:  # the waiter is released with an error, not hung
        waiter.result(timeout=5)
    assert exc.value.errno == errno.ECONNABORTED


def test_server_unmounts_when_the_test_process_dies(tmp_path):
    """A killed test run must not leave a stale mount behind."""
    from harness.skips import skip_or_fail

    from sharedfs.demo import fuse_available

    ok, reason = fuse_available()
    if not ok:
        skip_or_fail(reason)
    mnt = tmp_path / "mnt"
    script = textwrap.dedent(f"""
        import sys, time
        from sharedfs.demo import mount
        m = mount({str(tmp_path / 'backing')!r}, {str(mnt)!r}, "plain")
        print(m.state_dir, flush=True)
        time.sleep(60)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    try:
        state_dir = parent.stdout.readline().strip()
        assert is_mounted(mnt, FSTYPE) and os.path.isdir(state_dir)
        parent.kill()  # no atexit, no cleanup: only the server's watchdog can help
        parent.wait()
        deadline = time.monotonic() + 10
        while (is_mounted(mnt) or os.path.exists(state_dir)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not is_mounted(mnt)
        assert not os.path.exists(state_dir)
    finally:
        if parent.poll() is None:
            parent.kill()
        if is_mounted(mnt):
            subprocess.run(["umount", "-l", str(mnt)])


# ---------------------------------------------------------------------------
# lock profiles
# ---------------------------------------------------------------------------

REFUSING = [("lustre-noflock", "ENOSYS"), ("nfs-nolock", "ENOLCK")]


@pytest.mark.parametrize("profile,expected", REFUSING)
def test_refusing_profiles_fail_every_lock_call(hostile_mount, node, profile, expected):
    m = hostile_mount(profile)
    (m.backing / "lock").touch()
    proc = node("a")
    open_on([proc], m.path / "lock")
    calls = {
        "flock EX": "fcntl.flock(f, fcntl.LOCK_EX)",
        "flock SH|NB": "fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)",
        "lockf EX": "fcntl.lockf(f, fcntl.LOCK_EX)",
        "lockf EX|NB": "fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)",
        "os.lockf": "os.lockf(f.fileno(), os.F_TLOCK, 0)",
    }
    assert {name: outcome(proc, code) for name, code in calls.items()} == {name: expected for name in calls}
    # Data still flows; only locking is broken.
    assert outcome(proc, "f.write('x'); f.flush()") == "ok"


LOCK_CALLS = {"flock": "fcntl.flock(f, fcntl.{op})", "lockf": "fcntl.lockf(f, fcntl.{op})"}


@pytest.mark.parametrize("kind", sorted(LOCK_CALLS))
def test_localflock_excludes_within_a_node_only(hostile_mount, node, kind):
    m = hostile_mount("localflock")
    (m.backing / "lock").touch()
    a1, a2, b = node("a"), node("a"), node("b")
    open_on([a1, a2, b], m.path / "lock")

    def call(op: str) -> str:
        return LOCK_CALLS[kind].format(op=op)

    assert outcome(a1, call("LOCK_EX")) == "ok"
    assert outcome(a2, call("LOCK_EX | fcntl.LOCK_NB")) == "EAGAIN"  # same node: excluded
    assert outcome(b, call("LOCK_EX | fcntl.LOCK_NB")) == "ok"  # other node: both hold LOCK_EX

    a2.submit(call("LOCK_EX"))  # a blocking request waits...
    with pytest.raises(TimeoutError):
        a2.result(timeout=0.3)
    assert outcome(a1, call("LOCK_UN")) == "ok"
    a2.result(timeout=5)  # ...and gets the lock once it is released

    assert outcome(a1, call("LOCK_EX | fcntl.LOCK_NB")) == "EAGAIN"
    a2.run("f.close()")  # closing the file releases its lock too
    assert outcome(a1, call("LOCK_EX | fcntl.LOCK_NB")) == "ok"


HOLD_SCRIPT = """
import fcntl, json, sys, time
path, kind, rounds, hold = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
lock = fcntl.flock if kind == "flock" else fcntl.lockf
spans = []
with open(path, "r+") as f:
    for _ in range(rounds):
        lock(f, fcntl.LOCK_EX)
        start = time.monotonic()  # CLOCK_MONOTONIC: comparable across processes
        time.sleep(hold)
        spans.append((start, time.monotonic()))
        lock(f, fcntl.LOCK_UN)
print(json.dumps(spans))
"""


def overlaps(results) -> tuple[int, int]:
    """(same-node, cross-node) counts of overlapping lock-hold intervals."""
    spans = [(r.node, r.index, s, e) for r in results for s, e in json.loads(r.stdout)]
    same = cross = 0
    for (n1, i1, s1, e1), (n2, i2, s2, e2) in itertools.combinations(spans, 2):
        if i1 != i2 and s1 < e2 and s2 < e1:
            if n1 == n2:
                same += 1
            else:
                cross += 1
    return same, cross


@pytest.mark.parametrize("kind", sorted(LOCK_CALLS))
@pytest.mark.parametrize("profile", ["localflock", "plain"])
def test_exclusive_lock_holders_across_eight_processes_on_two_nodes(hostile_mount, profile, kind):
    m = hostile_mount(profile)
    (m.backing / "lock").touch()
    argv = [sys.executable, "-c", HOLD_SCRIPT, str(m.path / "lock"), kind, "2", "0.1"]
    results = run_on_nodes(argv, {"a": 4, "b": 4}, timeout=60)
    assert_all_ok(results)
    same, cross = overlaps(results)
    assert same == 0, "a node's processes held LOCK_EX at the same time"
    if profile == "localflock":
        assert cross > 0, "nodes never held the lock simultaneously; localflock should not exclude across nodes"
    else:
        assert cross == 0, "plain profile: the kernel's locks must exclude across all processes"


# ---------------------------------------------------------------------------
# lagging metadata
# ---------------------------------------------------------------------------


def test_lagging_hides_new_entries_from_other_nodes_for_the_lag(hostile_mount, node):
    m = hostile_mount("lagging", lag_ms=LAG_MS)
    (m.backing / "shared").mkdir()  # seeded behind the mount: visible to all at once
    root = str(m.path / "shared")
    a, b = node("a"), node("b")
    for proc in (a, b):
        proc.run(f"import os; root = {root!r}")

    a.run("os.mkdir(root + '/d'); open(root + '/f', 'w').write('data'); os.symlink('f', root + '/s')\n"
          "open(root + '/tmp', 'w').close(); os.rename(root + '/tmp', root + '/final')")
    created = time.monotonic()

    # The creator sees everything at once.
    assert a.run("sorted(os.listdir(root))") == ["d", "f", "final", "s"]
    assert a.run("os.path.isdir(root + '/d')") is True

    # Another node does not -- yet its mkdir/O_EXCL hit the existing entries.
    assert b.run("sorted(os.listdir(root))") == []
    assert b.run("os.path.isdir(root + '/d')") is False
    assert outcome(b, "os.makedirs(root + '/d', exist_ok=True)") == "EEXIST"  # the field bug
    assert outcome(b, "os.mkdir(root + '/d')") == "EEXIST"
    assert outcome(b, "open(root + '/f')") == "ENOENT"
    assert outcome(b, "open(root + '/final')") == "ENOENT"
    assert outcome(b, "os.open(root + '/f', os.O_CREAT | os.O_EXCL | os.O_WRONLY)") == "EEXIST"
    assert b.run("os.path.lexists(root + '/s')") is False
    assert time.monotonic() - created < 0.8 * LAG_MS / 1000, "machine too slow to observe the lag window"

    while not b.run("os.path.isdir(root + '/d')"):
        assert time.monotonic() - created < LAG_MS / 1000 + 3, "entry never became visible"
        time.sleep(0.01)
    visible_after = time.monotonic() - created
    assert visible_after >= 0.8 * LAG_MS / 1000

    time.sleep(0.1)  # the later entries were made a few ms after d
    assert b.run("sorted(os.listdir(root))") == ["d", "f", "final", "s"]
    assert b.run("open(root + '/f').read()") == "data"
    assert outcome(b, "os.makedirs(root + '/d', exist_ok=True)") == "ok"


# ---------------------------------------------------------------------------
# close-to-open data (nfs-cto)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("profile", ["plain", "nfs-cto", "nfs-cto+lagging"])
def test_nfs_cto_shows_other_nodes_a_file_as_of_its_writers_last_close(hostile_mount, node, profile):
    """A plain passthrough shows a file being written to every process at once; nfs-cto shows
    the other nodes what the writer last closed: a new file empty, a file rewritten in place
    its old content (transformers#22555: a module imported empty)."""
    m = hostile_mount(profile, lag_ms=LAG_MS)
    (m.backing / "shared").mkdir()
    (m.backing / "shared" / "old.py").write_bytes(b"OLD = 1\n")  # seeded: every node sees it at once
    root = str(m.path / "shared")
    writer, neighbour, other = node("a"), node("a"), node("b")
    for proc in (writer, neighbour, other):
        proc.run(f"import os; root = {root!r}")
    data = b"x = 1\n" * 20_000  # 120 kB, written and not closed yet
    writer.run(f"new = os.open(root + '/new.py', os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644); "
               f"os.write(new, {data!r}); old = os.open(root + '/old.py', os.O_RDWR); "
               f"os.pwrite(old, b'NEW = 2, 3, 4\\n', 0)")
    if "lagging" in profile:  # the new name reaches the other node after the lag; its data does not
        deadline = time.monotonic() + LAG_MS / 1000 + 3
        while not other.run("os.path.exists(root + '/new.py')"):
            assert time.monotonic() < deadline, "entry never became visible"
            time.sleep(0.02)
    read = "open(root + {name!r}, 'rb').read().decode()"
    size = "os.stat(root + {name!r}).st_size"

    # The writer's node shares one page cache: it sees everything written.
    assert neighbour.run(size.format(name="/new.py")) == len(data)
    assert neighbour.run(read.format(name="/old.py")) == "NEW = 2, 3, 4\n"
    if profile == "plain":  # one coherent page cache: what NFS never promises
        assert other.run(size.format(name="/new.py")) == len(data)
        assert other.run(read.format(name="/new.py")) == data.decode()
        assert other.run(read.format(name="/old.py")) == "NEW = 2, 3, 4\n"
        return
    assert other.run(size.format(name="/new.py")) == 0
    assert other.run(read.format(name="/new.py")) == ""
    assert other.run(size.format(name="/old.py")) == len(b"OLD = 1\n")
    assert other.run(read.format(name="/old.py")) == "OLD = 1\n"

    writer.run("os.fsync(old)")  # fsync sends the data too
    assert other.run(read.format(name="/old.py")) == "NEW = 2, 3, 4\n"
    writer.run("os.close(new); os.close(old)")  # close-to-open: the next open sees it all
    assert other.run(size.format(name="/new.py")) == len(data)
    assert other.run(read.format(name="/new.py")) == data.decode()


def test_nfs_cto_truncating_open_empties_the_file_for_every_node_at_once(hostile_mount, node):
    m = hostile_mount("nfs-cto")
    (m.backing / "f").write_bytes(b"before")
    path = str(m.path / "f")
    writer, other = node("a"), node("b")
    writer.run(f"f = open({path!r}, 'w'); f.write('after'); f.flush()")
    assert other.run(f"open({path!r}).read()") == ""  # NFS sends O_TRUNC as a SETATTR at once
    writer.run("f.close()")
    assert other.run(f"open({path!r}).read()") == "after"


def test_latency_is_added_to_metadata_operations(hostile_mount):
    slow, fast = hostile_mount("plain", latency_ms=50), hostile_mount("plain")
    per_stat = {}
    for label, m in (("slow", slow), ("fast", fast)):
        (m.backing / "f").touch()
        start = time.monotonic()
        for _ in range(5):
            os.stat(m.path / "f")
        per_stat[label] = (time.monotonic() - start) / 5
    assert per_stat["slow"] >= 0.05
    assert per_stat["slow"] - per_stat["fast"] >= 0.04


# ---------------------------------------------------------------------------
# LD_PRELOAD lock faults
# ---------------------------------------------------------------------------

PROBE_SCRIPT = """
import errno, fcntl, json, os, struct, sys
report = {}
for directory in sys.argv[1:]:
    results = {}
    calls = {
        "flock": lambda f: fcntl.flock(f, fcntl.LOCK_EX),
        "lockf": lambda f: fcntl.lockf(f, fcntl.LOCK_EX),
        "os.lockf": lambda f: os.lockf(f.fileno(), os.F_TLOCK, 0),
        "ofd": lambda f: fcntl.fcntl(f, fcntl.F_OFD_SETLK, struct.pack("@hhqqi4x", fcntl.F_WRLCK, 0, 0, 0, 0)),
        "F_GETFL": lambda f: fcntl.fcntl(f, fcntl.F_GETFL),
    }
    for name, call in calls.items():
        with open(os.path.join(directory, name), "w") as f:  # one file each: no self-conflicts
            try:
                call(f)
                results[name] = "ok"
            except OSError as exc:
                results[name] = errno.errorcode[exc.errno]
    report[directory] = results
print(json.dumps(report))
"""


@pytest.mark.parametrize("errno_name", ["ENOSYS", "ENOLCK"])
def test_preload_fails_locks_under_prefix_only(tmp_path, fault_preload, errno_name):
    shared, sibling, local = tmp_path / "shared", tmp_path / "shared2", tmp_path / "local"
    for d in (shared, sibling, local):
        d.mkdir()
    env = fault_preload([shared], errno_name)
    proc = subprocess.run([sys.executable, "-c", PROBE_SCRIPT, str(shared), str(sibling), str(local)],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    locks = ["flock", "lockf", "os.lockf", "ofd"]
    assert report[str(shared)] == dict({name: errno_name for name in locks}, F_GETFL="ok")
    all_ok = {name: "ok" for name in locks + ["F_GETFL"]}
    assert report[str(sibling)] == all_ok  # prefixes match whole path components
    assert report[str(local)] == all_ok


def test_preload_env_appends_to_existing_ld_preload(tmp_path, fault_preload):
    env = fault_preload(tmp_path, base={"LD_PRELOAD": "/opt/other.so", "PATH": os.environ.get("PATH", "")})
    first, ours = env["LD_PRELOAD"].split()
    assert first == "/opt/other.so" and ours.endswith(".so") and Path(ours).exists()
    assert env["SHAREDFS_FAULT_PREFIXES"] == os.path.realpath(tmp_path)
    assert env["SHAREDFS_FAULT_ERRNO"] == "ENOSYS"


# ---------------------------------------------------------------------------
# node helpers
# ---------------------------------------------------------------------------


def test_run_on_nodes_gives_each_process_its_node_index_and_local_root(tmp_path):
    code = """
        import os
        print(os.environ["SHAREDFS_NODE_ID"], os.environ["SHAREDFS_TEST_INDEX"], os.environ["SHAREDFS_CACHE_ROOT"])
    """
    results = run_on_nodes(code, {"a": 2, "b": 1}, local_root=tmp_path, timeout=30)
    assert_all_ok(results)
    seen = [r.stdout.split() for r in results]
    assert seen == [["a", "0", str(tmp_path / "a")], ["a", "1", str(tmp_path / "a")], ["b", "2", str(tmp_path / "b")]]

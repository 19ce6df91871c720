"""The filesystem by name, on real client mounts: JuiceFS (and MooseFS both ways) two clients apart.

sharedfs at 18c02b8 called every ``fuse.*`` mount "fuse", took its existence lock there and told
the user (``doctor``) that flock excludes only one node.  On JuiceFS that was wrong twice over:
JuiceFS's own flock excludes across clients, and a soft lock is one that programs without
sharedfs (stock filelock, which takes flock) never see.  Each test runs the old code first, from
a ``git worktree`` of that commit, then this checkout, on the same volume.  MooseFS mounted with
``mfsnobsdlocks,mfsnoposixlocks`` is the counterweight: there flock really is node-local, and
sharedfs must keep its existence lock; GlusterFS's flock excludes like JuiceFS's.  Last, an s3fs
bucket mount on a local S3 server: the old existence lock went to both clients at once, and now
taking a lock there fails in one line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.skips import skip_or_fail
from helpers import ROOT, clean_env

from sharedfs.demo.realfs import Volume

# xdist_group: one real volume at a time; MooseFS volumes of two workers at once disagreed with runs alone.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("realfs")]

#: The last commit before FUSE clients were named (fsinfo knew only "fuse").
OLD = "18c02b8"


@pytest.fixture(scope="module")
def old_checkout(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A worktree of :data:`OLD` (removed afterwards): the code before the change, run as it was."""
    where = tmp_path_factory.mktemp("old") / "sharedfs"
    made = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), OLD],
                          capture_output=True, text=True, check=False)
    if made.returncode != 0:
        skip_or_fail(f"cannot check out {OLD} (a shallow clone?): {made.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(where)],
                       capture_output=True, check=False)


def _python(code: str, *, old: Path | None = None, env: dict[str, str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter of this venv: this checkout's sharedfs, or ``old``'s (run from there:
    ``-c`` puts the working directory first on sys.path)."""
    extra = {"PYTHONPATH": str(old)} if old is not None else {}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=clean_env({**extra, **(env or {})}), cwd=old, check=False)


def _json(proc: subprocess.CompletedProcess[str]) -> dict:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


DOCTOR = """
    import json, sys
    from sharedfs.commands.doctor import doctor_report
    print(json.dumps(doctor_report(sys.argv[1] if len(sys.argv) > 1 else {path!r})))
"""


@pytest.mark.parametrize("realfs_kind", ["juicefs"], indirect=True)
def test_old_code_calls_juicefs_fuse_and_takes_its_soft_lock_this_one_names_it_and_takes_flock(
        real_volume, old_checkout: Path) -> None:  # type: ignore[no-untyped-def]
    vol: Volume = real_volume(nodes=2)
    path = str(vol.mounts[0])

    before = _json(_python(DOCTOR.format(path=path), old=old_checkout))
    assert (before["filesystem"]["kind"], before["lock"]["kind"]) == ("fuse", "soft")
    assert before["verdict"]["filesystem"].startswith("a FUSE filesystem")
    assert any("excludes only processes on the same node" in w for w in before["warnings"]), before["warnings"]

    status = _json(subprocess.run([sys.executable, "-m", "sharedfs", "status", path, "--json"], capture_output=True,
                                  text=True, env=clean_env(), check=False))
    (row,) = status["paths"]
    assert (row["name"], row["filesystem"]["kind"], row["filesystem"]["flock"]) == ("JuiceFS", "juicefs", "coherent")
    assert row["lock"]["kind"] == "flock" and row["lock"]["marker"]
    text = subprocess.run([sys.executable, "-m", "sharedfs", "status", path], capture_output=True, text=True,
                          env=clean_env(), check=False).stdout
    assert f"{path}: JuiceFS (fuse.juicefs at {path}), shared between nodes" in text

    doctor = _json(subprocess.run([sys.executable, "-m", "sharedfs", "doctor", "--json", path], capture_output=True,
                                  text=True, env=clean_env(), check=False))
    (after,) = doctor["paths"]
    assert after["verdict"]["filesystem"].startswith("JuiceFS (fuse.juicefs mounted at")
    assert after["lock"]["kind"] == "flock" and after["filesystem"]["safe_lock"] == "flock"
    assert not any("same node" in w for w in after["warnings"]), after["warnings"]
    assert after["verdict"]["better"].startswith("nothing")


# A holder on one "node" (client mount): takes the lock, says so, holds until told to go.
HOLD = """
    import sys
    {take}
    print("held", flush=True)
    sys.stdin.readline()
"""
FLOCK = "import fcntl, os; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); fcntl.flock(fd, fcntl.LOCK_EX)"
SHAREDFS_LOCK = "import sharedfs; lock = sharedfs.lock(sys.argv[1]); lock.acquire(); print(lock.kind, flush=True)"

# A process on the other node tries once; prints what it got.
TRY_FLOCK = """
    import fcntl, os, sys
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        print("GOT")
    except BlockingIOError:
        print("REFUSED")
"""
TRY_STOCK_FILELOCK = """
    import sys, filelock
    try:
        filelock.FileLock(sys.argv[1]).acquire(timeout=0)
        print("GOT")
    except filelock.Timeout:
        print("REFUSED")
"""


def _hold(take: str, path: Path, *, old: Path | None = None, env: dict[str, str] | None = None) -> subprocess.Popen:
    extra = {"PYTHONPATH": str(old)} if old is not None else {}
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(HOLD.format(take=take)), str(path)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=clean_env({**extra, **(env or {})}), cwd=old)
    lines = []
    while True:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line, f"the holder died: {proc.stderr.read()}"  # type: ignore[union-attr]
        lines.append(line.strip())
        if line.strip() == "held":
            proc.lines = lines  # type: ignore[attr-defined]
            return proc


def _release(proc: subprocess.Popen) -> None:
    proc.stdin.write("\n")  # type: ignore[union-attr]
    proc.stdin.flush()  # type: ignore[union-attr]
    proc.wait(timeout=30)


def _try(code: str, path: Path, **env: str) -> str:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code), str(path)], capture_output=True, text=True,
                          timeout=60, env=clean_env(env), check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def _visible(path: Path, timeout: float = 10.0) -> None:
    """Wait until a name made through one client shows through another (entry caches)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never showed on this client"
        time.sleep(0.1)


@pytest.mark.parametrize(("realfs_kind", "node_local", "excludes"),
                         [("juicefs", False, True), ("moosefs", False, True), ("moosefs", True, False),
                          ("glusterfs", False, True)],
                         ids=["juicefs", "moosefs", "moosefs-mfsnobsdlocks", "glusterfs"], indirect=["realfs_kind"])
def test_flock_across_two_client_mounts_is_what_sharedfs_says_it_is(real_volume, node_local: bool,
                                                                   excludes: bool) -> None:  # type: ignore[no-untyped-def]
    vol: Volume = real_volume(nodes=2, node_local_locks=node_local) if node_local else real_volume(nodes=2)
    a, b = vol.mounts
    (a / "probe").write_text("")
    _visible(b / "probe")
    holder = _hold(FLOCK, a / "probe")
    try:
        seen = _try(TRY_FLOCK, b / "probe")
    finally:
        _release(holder)
    assert seen == ("REFUSED" if excludes else "GOT")
    assert _try(TRY_FLOCK, b / "probe") == "GOT"  # released: the other client takes it

    status = _json(subprocess.run([sys.executable, "-m", "sharedfs", "status", str(a), "--json"],
                                  capture_output=True, text=True, env=clean_env(), check=False))
    (row,) = status["paths"]
    assert row["filesystem"]["flock"] == ("coherent" if excludes else "node-local")
    assert row["lock"]["kind"] == ("flock" if excludes else "soft"), row["lock"]
    if node_local:
        assert any("mfsnobsdlocks" in note for note in row["filesystem"]["notes"])


@pytest.mark.parametrize("realfs_kind", ["juicefs"], indirect=True)
def test_stock_filelock_on_the_other_client_is_excluded_only_once_sharedfs_takes_juicefs_flock(
        real_volume, old_checkout: Path) -> None:  # type: ignore[no-untyped-def]
    vol: Volume = real_volume(nodes=2)
    a, b = vol.mounts
    (a / "entry.lock").write_text("")
    _visible(b / "entry.lock")

    # Before: the old sharedfs holds its soft lock; a program without sharedfs on the other node
    # (stock filelock: flock) gets the same lock at once. Two holders.
    old = _hold(SHAREDFS_LOCK, a / "entry.lock", old=old_checkout)
    try:
        assert old.lines[0] == "soft", old.lines  # type: ignore[attr-defined]
        assert _try(TRY_STOCK_FILELOCK, b / "entry.lock", SHAREDFS_DISABLE="1") == "GOT"
    finally:
        _release(old)

    # After: sharedfs takes JuiceFS's flock, which the other client's filelock respects.
    new = _hold(SHAREDFS_LOCK, a / "entry.lock")
    try:
        assert new.lines[0] == "flock", new.lines  # type: ignore[attr-defined]
        assert _try(TRY_STOCK_FILELOCK, b / "entry.lock", SHAREDFS_DISABLE="1") == "REFUSED"
    finally:
        _release(new)
    assert _try(TRY_STOCK_FILELOCK, b / "entry.lock", SHAREDFS_DISABLE="1") == "GOT"
    assert os.path.exists(a / "entry.lock")


# -- a bucket mount: s3fs (Debian) on a local S3 server (moto), two client mounts -------------------


def _wait(predicate, what: str, proc: subprocess.Popen | None = None, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"{what}: the process exited with {proc.returncode}")
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.1)


def _mounted(path: Path) -> bool:
    with open("/proc/self/mountinfo") as table:
        return any(line.split()[4] == str(path) for line in table)


@pytest.fixture
def s3fs_mounts(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """One bucket on a moto S3 server on loopback, mounted twice with s3fs (two "nodes"); all gone after."""
    import shutil
    import urllib.request

    from helpers import HELPERS

    from sharedfs.demo.frameworkvenv import VenvBuildError, cached_venv
    from sharedfs.demo.ports import free_port

    if shutil.which("s3fs") is None:
        skip_or_fail("s3fs is not installed (apt-get install s3fs)")
    try:
        server_venv = cached_venv("s3server", HELPERS / "s3server_requirements.txt")
    except VenvBuildError as exc:
        skip_or_fail(f"cannot build the local S3 server's venv: {exc}")
    port = free_port()
    procs: list[subprocess.Popen] = []
    mounts = (tmp_path / "a", tmp_path / "b")
    log = open(tmp_path / "moto.log", "w")  # noqa: SIM115 - closed in the finally below
    try:
        procs.append(subprocess.Popen([str(server_venv / "bin" / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                                      stdout=log, stderr=subprocess.STDOUT))
        url = f"http://127.0.0.1:{port}"

        def bucket_made() -> bool:
            try:
                urllib.request.urlopen(urllib.request.Request(f"{url}/sfs", method="PUT"), timeout=2).close()
                return True
            except OSError:
                return False

        _wait(bucket_made, "the local S3 server", procs[0])
        secret = tmp_path / "passwd"
        secret.write_text("test:test\n")
        secret.chmod(0o600)
        for mount in mounts:
            mount.mkdir()
            procs.append(subprocess.Popen(["s3fs", "sfs", str(mount), "-f", "-o",
                                           f"passwd_file={secret},url={url},use_path_request_style,stat_cache_expire=1"],
                                          stdout=log, stderr=subprocess.STDOUT))
            _wait(lambda m=mount: _mounted(m), f"s3fs at {mount}", procs[-1])
        yield mounts
    finally:
        for mount in mounts:
            if _mounted(mount):
                subprocess.run(["umount", "-l", str(mount)], capture_output=True, check=False)
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()


TAKE = """
    import sys, sharedfs
    lock = sharedfs.lock(sys.argv[1])
    try:
        lock.acquire(timeout=0)
    except Exception as exc:
        print(type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
        raise SystemExit(0)
    print("GOT", lock.kind)
"""


def _take(path: Path, *, old: Path | None = None) -> str:
    """One try at ``sharedfs.lock(path)`` in a new process (this checkout's sharedfs, or ``old``'s)."""
    proc = _python(TAKE.replace("sys.argv[1]", repr(str(path))), old=old)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_a_bucket_mount_gave_two_nodes_one_lock_and_now_refuses_it_in_one_line(
        s3fs_mounts: tuple[Path, Path], old_checkout: Path) -> None:
    a, b = s3fs_mounts
    # What the bucket does, through its two clients: no hard link, an exclusive create each, flock per client.
    (a / "f").write_text("x")
    _visible(b / "f")
    with pytest.raises(OSError):
        os.link(a / "f", a / "g")
    created = []
    for mount in (a, b):
        created.append(os.open(mount / "x", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    for fd in created:
        os.close(fd)
    holder = _hold(FLOCK, a / "f")
    try:
        assert _try(TRY_FLOCK, b / "f") == "GOT"
    finally:
        _release(holder)

    # Before: the old sharedfs hands out its existence lock on both clients at once.
    old = _hold(SHAREDFS_LOCK, a / "entry.lock", old=old_checkout)
    try:
        assert old.lines[0] == "soft", old.lines  # type: ignore[attr-defined]
        assert _take(b / "entry.lock", old=old_checkout) == "GOT soft"
    finally:
        _release(old)

    # After: one line, naming the filesystem, the mount and the fix; no lock is handed out.
    line = _take(b / "entry2.lock")
    assert line.startswith("NoSafeLockError no lock excludes other nodes on s3fs (an S3 bucket) (fuse.s3fs at"), line
    assert str(b) in line and "SHAREDFS_CACHE=node-local" in line

    status = _json(subprocess.run([sys.executable, "-m", "sharedfs", "status", str(a), "--json"],
                                  capture_output=True, text=True, env=clean_env(), check=False))
    (row,) = status["paths"]
    assert (row["filesystem"]["kind"], row["filesystem"]["hard_links"], row["lock"]["kind"]) == ("bucket", False, "none")
    doctor = _json(subprocess.run([sys.executable, "-m", "sharedfs", "doctor", "--json", str(a)],
                                  capture_output=True, text=True, env=clean_env(), check=False))
    (report,) = doctor["paths"]
    assert report["verdict"]["filesystem"].startswith("s3fs (an S3 bucket) (fuse.s3fs mounted at")
    assert report["verdict"]["sharedfs"].startswith("NO lock") and report["verdict"]["better"].startswith("keep locks")

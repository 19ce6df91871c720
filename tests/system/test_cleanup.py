"""Job-scoped node-local directories: kept between a job's steps, removed when the job is over, by the right user.

Steps and runs are real processes; the epilog's cleanup runs as root for real,
throwaway users (useradd), because what it may touch is the subject.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import clean_env
from helpers.unixusers import User, owned_by, throwaway_users

import sharedfs
from sharedfs.cluster import cleanup
from sharedfs.cluster.cleanup import JobCleanupError, cleanup_job
from sharedfs.model.records import HolderRecord, process_start_time

CHECKOUT = str(Path(sharedfs.__file__).resolve().parents[1])

STEP = """
import json, os, sys
import sharedfs
path = sharedfs.node_local_dir("cache")
if sys.argv[1] == "write":
    (path / "prepared.arrow").write_text("expensive")
print(json.dumps({"path": str(path), "found": (path / "prepared.arrow").exists(), "pid": os.getpid()}), flush=True)
if sys.argv[1] == "wait":
    sys.stdin.readline()   # stay alive until told to exit
"""


def step_env(root: Path, **extra: str) -> dict[str, str]:
    return clean_env({"PYTHONPATH": CHECKOUT, "SHAREDFS_CACHE_ROOT": str(root), **extra})


def run_step(root: Path, how: str, **extra: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", STEP, how], check=False, capture_output=True, text=True,
                          env=step_env(root, **extra), timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_a_slurm_job_keeps_its_node_local_cache_between_steps(tmp_path: Path) -> None:
    """srun step 0 prepares the cache and exits; step 1 of the same job finds it (it used to be gone)."""
    first = run_step(tmp_path, "write", SLURM_JOB_ID="5150", SLURM_STEP_ID="0")
    second = run_step(tmp_path, "read", SLURM_JOB_ID="5150", SLURM_STEP_ID="1")
    assert first["path"] == second["path"] == str(tmp_path / f"sharedfs-{os.getuid()}" / "job-5150" / "cache")
    assert second["found"], "step 1 lost the node-local cache step 0 prepared"
    # ... until the epilog: the job is over.
    report = cleanup_job("5150", uid=os.getuid(), root=str(tmp_path))
    assert report["removed"][0] == str(tmp_path / f"sharedfs-{os.getuid()}" / "job-5150") and report["live"] == []
    assert not Path(first["path"]).parent.exists()


def test_outside_slurm_the_runs_last_process_removes_the_directory(tmp_path: Path) -> None:
    env = step_env(tmp_path, TORCHELASTIC_RUN_ID="run7")
    waiting = subprocess.Popen([sys.executable, "-c", STEP, "wait"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True, env=env)
    try:
        assert waiting.stdout is not None
        path = Path(json.loads(waiting.stdout.readline())["path"])
        run_step(tmp_path, "write", TORCHELASTIC_RUN_ID="run7")
        assert (path / "prepared.arrow").exists(), "a process left while another of the run still uses the directory"
    finally:
        waiting.communicate("\n", timeout=60)
    assert waiting.returncode == 0
    assert not path.parent.exists(), "the run's last process should have removed the job directory"
    assert sorted(p.name for p in path.parents[1].iterdir()) == []  # and its lock file


def test_live_markers_are_holder_records(tmp_path: Path) -> None:
    env = step_env(tmp_path, SLURM_JOB_ID="31", SHAREDFS_NODE_ID="nodeA")
    waiting = subprocess.Popen([sys.executable, "-c", STEP, "wait"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True, env=env)
    try:
        assert waiting.stdout is not None
        info = json.loads(waiting.stdout.readline())
        markers = list((Path(info["path"]).parent / cleanup.LIVE_DIR).iterdir())
        assert [m.name for m in markers] == [f"nodeA-{info['pid']}"]
        assert oct(markers[0].stat().st_mode & 0o777) == "0o600"
        record = HolderRecord.parse(markers[0].read_bytes())
        assert record is not None and (record.pid, record.node, record.kind) == (info["pid"], "nodeA", "user")
        assert record.slurm_job == "31" and record.start_time == process_start_time(info["pid"])
    finally:
        waiting.communicate("\n", timeout=60)
    assert markers[0].exists() is False  # removed at exit; the directory stays (Slurm: the epilog's job)


# -- liveness as cleanup sees it ---------------------------------------------------------------------


def make_job(root: Path, job: str, markers: dict[str, bytes]) -> Path:
    job_dir = root / f"sharedfs-{os.getuid()}" / job
    (job_dir / cleanup.LIVE_DIR).mkdir(parents=True, mode=0o700)
    (job_dir / "data").write_text("x")
    for name, content in markers.items():
        (job_dir / cleanup.LIVE_DIR / name).write_bytes(content)
    return job_dir


def record_of(pid: int, node: str) -> bytes:
    facts = HolderRecord.mine(node, "user")
    return HolderRecord(node=node, pid=pid, acquired_at=facts.acquired_at, kind="user",
                        start_time=process_start_time(pid), boot_id=facts.boot_id, pidns=facts.pidns).to_bytes()


@pytest.fixture
def policy_env(fresh_runtime, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("SHAREDFS_NODE_ID", "here")
    monkeypatch.setenv("SHAREDFS_CACHE_ROOT", str(tmp_path))
    return fresh_runtime


def test_cleanup_waits_for_a_live_marker_and_removes_a_dead_ones(policy_env, tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    job_dir = make_job(tmp_path, "job-1", {f"here-{os.getpid()}": record_of(os.getpid(), "here")})
    report = cleanup_job("1")
    assert report["live"] == [f"here-{os.getpid()}"] and "still use" in report["skipped"] and job_dir.is_dir()

    job_dir = make_job(tmp_path, "job-2", {f"here-{dead.pid}": record_of(dead.pid, "here")})
    report = cleanup_job("2")
    assert report["live"] == [] and not job_dir.exists()


@pytest.mark.parametrize("content", [b"", b"12345", b'{"node": "here", "pid": "1"}', b"\xff" * 5000])
def test_a_marker_that_is_not_a_record_counts_as_alive(policy_env, tmp_path: Path, content: bytes) -> None:
    job_dir = make_job(tmp_path, "job-3", {"here-1": content})
    assert cleanup_job("3")["live"] == ["here-1"] and job_dir.is_dir()
    assert cleanup_job("3", force=True)["live"] == ["here-1"] and not job_dir.exists()


def test_in_the_jobs_own_epilog_markers_do_not_hold_the_directory(policy_env, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Slurm runs the epilog after killing the job's processes: a marker left in another PID namespace is stale."""
    job_dir = make_job(tmp_path, "job-4", {"here-1": b"not checkable from here"})
    monkeypatch.setenv("SLURM_SCRIPT_CONTEXT", "epilog_slurmd")
    monkeypatch.setenv("SLURM_JOB_ID", "5")  # the epilog of another job
    assert cleanup_job("4")["live"] == ["here-1"] and job_dir.is_dir()
    monkeypatch.setenv("SLURM_JOB_ID", "4")
    assert cleanup_job("4")["removed"][0] == str(job_dir) and not job_dir.exists()


# -- root cleaning for a real user -------------------------------------------------------------------


@pytest.fixture
def two_users() -> Iterator[tuple[User, User, Path]]:
    with throwaway_users(2) as (user, other):
        base = Path(tempfile.mkdtemp(prefix="sharedfs-cleanup-", dir="/tmp"))
        base.chmod(0o1777)
        try:
            yield user, other, base
        finally:
            shutil.rmtree(base, ignore_errors=True)


def user_tree(user: User, base: Path, job: str = "job-9") -> Path:
    """``<base>/sharedfs-<uid>/job-9/data/file``, made by the user's own process."""
    job_dir = base / f"sharedfs-{user.uid}" / job
    made = user.python("import os, sys; os.makedirs(sys.argv[1] + '/data', 0o700); "
                       "open(sys.argv[1] + '/data/file', 'w').write('x'); "
                       "os.chmod(os.path.dirname(sys.argv[1]), 0o700)", str(job_dir))
    assert made.returncode == 0, made.stderr
    return job_dir


def test_root_creates_no_file_in_the_users_directory(fresh_runtime, two_users) -> None:
    """The job lock file is the user's even when root's cleanup is what creates it (it used to be root's)."""
    user, _, base = two_users
    job_dir = user_tree(user, base)
    sleeper = user.popen(["sleep", "120"])
    try:
        # A live process of the job on this node (not the epilog): cleanup must leave the directory ...
        marker = job_dir / cleanup.LIVE_DIR / f"{fresh_runtime.policy().node_id}-{sleeper.pid}"
        marker.parent.mkdir(mode=0o700)
        marker.write_bytes(record_of(sleeper.pid, fresh_runtime.policy().node_id))
        for path in (marker.parent, marker):
            os.chown(path, user.uid, user.gid)
        report = cleanup_job("9", uid=user.uid, root=str(base))
        assert report["live"] == [marker.name] and job_dir.is_dir()
        # ... and whatever it created on the way belongs to the user.
        assert owned_by(0, str(base / f"sharedfs-{user.uid}")) == []
        lock = base / f"sharedfs-{user.uid}" / "job-9.lock"
        assert lock.exists() and lock.stat().st_uid == user.uid
    finally:
        sleeper.kill()
        sleeper.wait()
    report = cleanup_job("9", uid=user.uid, root=str(base))
    assert report["live"] == [] and not job_dir.exists() and not lock.exists()


def test_root_removes_only_what_the_user_could_remove(fresh_runtime, two_users) -> None:
    """A directory of another user inside the job directory (the user had opened it to others) is left to them."""
    user, other, base = two_users
    job_dir = user_tree(user, base)
    job_dir.parent.chmod(0o711)
    job_dir.chmod(0o777)  # the user opens her job directory ...
    made = other.python("import os, sys; os.mkdir(sys.argv[1], 0o755); open(sys.argv[1] + '/theirs', 'w').write('y')",
                        str(job_dir / "shared"))  # ... and another user puts their work in it
    assert made.returncode == 0, made.stderr
    report = cleanup_job("9", uid=user.uid, root=str(base))
    assert (job_dir / "shared" / "theirs").read_text() == "y"
    assert report["left"] == [f"{job_dir}/shared/theirs: Permission denied",
                              f"{job_dir}/shared: Directory not empty"]
    assert "2 entries could not be removed" in report["skipped"]
    assert not (job_dir / "data").exists()  # the user's own entries are gone


def test_root_never_follows_a_symlink_in_the_users_tree(fresh_runtime, two_users) -> None:
    user, other, base = two_users
    victim = base / "victim"
    made = other.python("import os, sys; os.mkdir(sys.argv[1], 0o755); open(sys.argv[1] + '/precious', 'w').write('z')",
                        str(victim))
    assert made.returncode == 0, made.stderr
    job_dir = user_tree(user, base)
    linked = user.python("import os, sys; os.symlink(sys.argv[2], sys.argv[1] + '/link'); "
                         "os.symlink(sys.argv[2] + '/precious', sys.argv[1] + '/data/link')", str(job_dir), str(victim))
    assert linked.returncode == 0, linked.stderr
    report = cleanup_job("9", uid=user.uid, root=str(base))
    assert report["removed"][0] == str(job_dir) and not job_dir.exists()
    assert (victim / "precious").read_text() == "z"


@pytest.fixture
def lock_held_by_the_user(two_users) -> Iterator[tuple[User, Path, Path]]:
    """The user's job directory, and a process of the user holding its job lock (util-linux flock(1))."""
    user, _, base = two_users
    job_dir = user_tree(user, base)
    lock = job_dir.parent / "job-9.lock"
    holder = user.popen(["flock", str(lock), "sleep", "120"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not lock.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        yield user, base, job_dir
    finally:
        os.killpg(holder.pid, signal.SIGKILL)  # flock(1) and the sleep it runs, which holds the lock too
        holder.wait()


def test_root_does_not_wait_forever_for_a_lock_the_user_holds(fresh_runtime, lock_held_by_the_user,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    user, base, job_dir = lock_held_by_the_user
    monkeypatch.setattr(cleanup, "LOCK_WAIT", 0.5)  # the epilog's bound, shortened for the test
    with pytest.raises(JobCleanupError, match="stayed locked for 0.5 s"):
        cleanup_job("9", uid=user.uid, root=str(base))
    assert job_dir.is_dir()


def test_root_stops_a_cleanup_that_does_not_finish(fresh_runtime, lock_held_by_the_user,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The child running as the user is killed at the deadline (here it waits for the lock; in the field, a
    filesystem that stops answering): the epilog reports and ends instead of hanging the node."""
    user, base, job_dir = lock_held_by_the_user
    monkeypatch.setattr(cleanup, "LOCK_WAIT", 120.0)
    started = time.monotonic()
    with pytest.raises(JobCleanupError, match=f"cleaning as uid {user.uid} did not finish within 1 s"):
        cleanup_job("9", uid=user.uid, root=str(base), timeout=1.0)
    assert time.monotonic() - started < 10 and job_dir.is_dir()


def test_a_swapped_user_directory_is_refused(two_users) -> None:
    user, other, base = two_users
    (base / f"sharedfs-{user.uid}").symlink_to(base)
    with pytest.raises(JobCleanupError, match="is not a plain directory"):
        cleanup_job("9", uid=user.uid, root=str(base))
    (base / f"sharedfs-{user.uid}").unlink()
    user_tree(other, base)
    os.rename(base / f"sharedfs-{other.uid}", base / f"sharedfs-{user.uid}")
    with pytest.raises(JobCleanupError, match=f"owned by uid {other.uid}, not uid {user.uid}"):
        cleanup_job("9", uid=user.uid, root=str(base))

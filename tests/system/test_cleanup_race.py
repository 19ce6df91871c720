"""Root's epilog cleanup against a user who swaps her directories for symlinks while it runs.

``sharedfs cleanup --job ID --uid UID`` runs as root in Slurm's epilog, inside
``<root>/sharedfs-<uid>/``, a directory the user owns and can rename.  The old
walk checked ``sharedfs-<uid>`` with ``lstat`` and then removed
``<root>/sharedfs-<uid>/job-<ID>`` by *path*: a user who swaps her directory
for a symlink between the two makes root remove ``job-<ID>`` of whatever
directory the symlink names -- another user's -- and create a root-owned
``job-<ID>.lock`` there.

Real users (useradd), a real racing process of the attacker (swapping with
``renameat2(RENAME_EXCHANGE)`` in a tight loop), and the old walk kept below as
the baseline: it must lose the victim's file at least once in ``OLD_RUNS``
tries (or more, up to ``OLD_UNTIL_LOST`` seconds); the new cleanup must never, in ``NEW_RUNS`` tries, and must leave no
root-owned file in either user's directories.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers.unixusers import User, owned_by, throwaway_users, user_python

from sharedfs.cluster.cleanup import JobCleanupError, cleanup_job

pytestmark = pytest.mark.slow

JOB = "job-4711"
#: Tries per test.  Measured on the 2-core development machine (fs.protected_symlinks=0), the old walk lost
#: the victim's file 10, 26 and 48 times in three series of 6000 (and 4 in 1500): at the lowest rate seen,
#: 6000 tries all miss with a chance of about 5e-5.  The new walk gets as
#: many at the user level; at the job level each try forks a cleanup child (~10 ms), so fewer.
OLD_RUNS = 6000
#: ... and more, up to this many seconds, until it lost the victim's file (6000 runs lost it 0 times once, on
#: a loaded machine: the swap has to land between the walk's lstat and its removal).
OLD_UNTIL_LOST = 120.0
NEW_RUNS = {"user": 6000, "job": 600}

RACER = r"""
import ctypes, os, sys, time
root, uid, victim_job, level, stop = sys.argv[1:6]
libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, RENAME_EXCHANGE = -100, 2

def exchange(a, b):
    libc.renameat2(AT_FDCWD, a.encode(), AT_FDCWD, b.encode(), RENAME_EXCHANGE)

def populate(dir_fd, name):
    try:
        os.mkdir(name, 0o700, dir_fd=dir_fd)
    except FileExistsError:
        pass
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError:
        return
    for i in range(3):
        try:
            os.close(os.open(f"data-{i}", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd))
        except OSError:
            pass
    os.close(fd)

user = f"sharedfs-{uid}"
os.chdir(root)
os.mkdir(user, 0o700)
user_fd = os.open(user, os.O_RDONLY | os.O_DIRECTORY)       # follows the real directory wherever it is
if level == "user":                                          # swap <root>/sharedfs-<uid> with a symlink
    os.symlink(os.path.dirname(victim_job), user + ".alt")
    a, b = user, user + ".alt"
else:                                                        # swap <root>/sharedfs-<uid>/job-<ID> with a symlink
    os.chdir(user)
    a, b = os.path.basename(victim_job), os.path.basename(victim_job) + ".alt"
    os.symlink(victim_job, b)
print("ready", flush=True)
while not os.path.exists(stop):
    if level == "user":
        populate(user_fd, os.path.basename(victim_job))      # the cleanup keeps removing it
    else:
        for name in (a, b):
            if not os.path.lexists(name):
                other = b if name == a else a
                if os.path.islink(other):
                    populate(user_fd, name)
                else:
                    os.symlink(victim_job, name)
        real = a if not os.path.islink(a) else b
        populate(user_fd, real)
    for _ in range(64):
        exchange(a, b)
# leave the real directory under its own name
if os.path.islink(a) and not os.path.islink(b):
    exchange(a, b)
"""


def old_cleanup_job(job: str, uid: int, root: str) -> None:
    """The walk of sharedfs/cluster/cleanup.py before it used directory descriptors (commit 6175c79), minus liveness.

    Kept verbatim where it touches the filesystem: lstat of the user directory, then
    everything by path (the lock file, the liveness listing, shutil.rmtree).
    """
    user_dir = Path(root, f"sharedfs-{uid}")
    target = user_dir / job
    st = os.lstat(user_dir)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
        raise JobCleanupError("refused")
    if os.path.lexists(target):
        fd = os.open(target.parent / f"{target.name}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX)
            with contextlib.suppress(FileNotFoundError):
                os.listdir(target / ".sharedfs-live")
            lst = os.lstat(target)
            if stat.S_ISLNK(lst.st_mode):
                os.unlink(target)
            else:
                shutil.rmtree(target)
        finally:
            os.close(fd)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(target.parent / f"{target.name}.lock")


@pytest.fixture
def arena() -> Iterator[tuple[list[User], Path]]:
    """An attacker and a victim, and a directory both can reach (pytest's tmp_path is root-only)."""
    with throwaway_users(2) as users:
        base = Path(tempfile.mkdtemp(prefix="sharedfs-race-", dir="/tmp"))
        try:
            base.chmod(0o755)
            yield users, base
        finally:
            shutil.rmtree(base, ignore_errors=True)


def node_local_root(base: Path, attacker: User) -> Path:
    """A root like /tmp (1777).  With fs.protected_symlinks=1 the kernel itself refuses to let root follow
    the attacker's symlink in a sticky world-writable directory, so the baseline could not hit; then the
    root is a group-writable one without the sticky bit, where that protection does not apply."""
    root = base / "local"
    root.mkdir()
    if Path("/proc/sys/fs/protected_symlinks").read_text().strip() == "0":
        root.chmod(0o1777)
    else:
        os.chown(root, 0, attacker.gid)
        root.chmod(0o770)
    return root


def plant_victim(victim: User, base: Path) -> Path:
    """``<victim dir>/job-<ID>/precious``, all the victim's: what the attacker's symlink points root at."""
    vdir = base / "victim"
    for path, mode in ((vdir, 0o755), (vdir / JOB, 0o755)):
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=mode)
        os.chown(path, victim.uid, victim.gid)
    precious = vdir / JOB / "precious"
    if not precious.exists():
        fd = os.open(precious, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        os.fchown(fd, victim.uid, victim.gid)
        os.write(fd, b"the victim's work")
        os.close(fd)
    return precious


def race(level: str, users: list[User], base: Path, clean: Callable[[int, str], None],
         runs: int, until_lost: float = 0.0) -> dict[str, object]:
    """``runs`` cleanups against the racer; with ``until_lost`` (seconds), more until the victim's file and a
    root-owned file in her directory were each seen at least once (the baseline: the race is a race)."""
    attacker, victim = users
    root = node_local_root(base, attacker)
    precious = plant_victim(victim, base)
    stop = base / "stop"
    racer = attacker.popen([user_python(), "-I", "-S", "-c", RACER, str(root),
                            str(attacker.uid), str(precious.parent), level, str(stop)],
                           stdout=-1, stderr=-1)
    assert racer.stdout is not None and racer.stdout.readline().strip() == "ready", racer.communicate()
    hits, refused, cleaned, root_files_in_victim, examples = 0, 0, 0, 0, set()
    started = time.monotonic()
    try:
        deadline = started + until_lost
        done = 0
        while done < runs or (not (hits and root_files_in_victim) and time.monotonic() < deadline):
            done += 1
            try:
                clean(attacker.uid, str(root))
                cleaned += 1
            except (JobCleanupError, OSError):
                refused += 1  # the swapped state seen and refused (or the old walk's rmtree refusing a symlink)
            if not precious.exists():
                hits += 1
            for path in owned_by(0, str(base / "victim")):
                root_files_in_victim += 1
                examples.add(path)
                os.unlink(path)  # the old walk's lock file: count it, then let the next run start clean
            plant_victim(victim, base)
    finally:
        stop.touch()
        racer.wait(timeout=30)
    elapsed = time.monotonic() - started
    user_dir = root / f"sharedfs-{attacker.uid}"
    assert user_dir.is_dir() and not user_dir.is_symlink(), "the racer left its directory swapped"
    return {"runs": done, "hits": hits, "refused": refused, "cleaned": cleaned, "seconds": round(elapsed, 1),
            "root_files_in_victim": root_files_in_victim, "examples": sorted(examples),
            "root_owned_in_attacker": owned_by(0, str(user_dir))}


def new_cleanup(uid: int, root: str) -> None:
    cleanup_job(JOB, uid=uid, root=root, timeout=30)


def old_cleanup(uid: int, root: str) -> None:
    old_cleanup_job(JOB, uid, root)


def test_old_walk_deletes_the_victims_file_when_the_user_dir_is_swapped(arena) -> None:
    users, base = arena
    result = race("user", users, base, old_cleanup, OLD_RUNS, until_lost=OLD_UNTIL_LOST)
    print(f"old walk, user level: {result}")
    assert result["hits"] >= 1, f"the baseline should have lost the victim's file at least once: {result}"
    assert result["root_files_in_victim"] >= 1, result  # root's job-<ID>.lock, created through the symlink


@pytest.mark.parametrize("level", ["user", "job"])
def test_new_cleanup_never_touches_the_victim_and_creates_nothing_as_root(arena, level: str) -> None:
    users, base = arena
    result = race(level, users, base, new_cleanup, NEW_RUNS[level])
    print(f"new cleanup, {level} level: {result}")
    assert result["hits"] == 0, result
    assert result["root_files_in_victim"] == 0 and result["root_owned_in_attacker"] == [], result
    # Not vacuous: while the directory is real the cleanup goes ahead (and removes the attacker's job dir).
    assert result["cleaned"] >= 10, f"the race should not stop every cleanup: {result}"

"""A hostile member of a project group cannot turn a victim's lock against her (real users, a 2775 directory).

sharedfs 0.1 wrote an existence lock's holder record to ``<lock>.holder`` with
``open(O_WRONLY|O_CREAT|O_TRUNC)``: a group member who planted a symlink there made the victim's
own lock overwrite the victim's own 0600 file, and a FIFO there hung the victim while she held the
lock.  Now the record is the marker itself (``<lock>.held``), created ``O_EXCL|O_NOFOLLOW``: a
planted name of any kind is never written through; it reads as "held by something that is not a
sharedfs record", and the victim's acquire times out cleanly, saying what it found.
Each case runs sharedfs as it was (the attack succeeds) and as it is (refused).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.shardcache_support import group_of_users, scratch, sharedfs_before

SECRET = "the victim's own data\n"

VICTIM = """
import sys, sharedfs
lock = sharedfs.lock(sys.argv[1], kind="soft", timeout=float(sys.argv[2]))
try:
    with lock:
        print("acquired", flush=True)
except Exception as exc:
    print("refused", type(exc).__name__, flush=True)
"""


def _project(root: Path, group: int) -> Path:
    project = root / "project"
    project.mkdir()
    os.chown(project, 0, group)
    project.chmod(0o2775)  # a group-writable project directory, as on every cluster
    return project


def _secret(victim) -> Path:  # type: ignore[no-untyped-def]
    secret = victim.home / "secret.txt"
    secret.write_text(SECRET)
    os.chown(secret, victim.uid, victim.gid)
    secret.chmod(0o600)
    return secret


@pytest.mark.parametrize("version", ["0.1", "now"])
def test_a_symlink_planted_where_the_record_goes_never_writes_through(tmp_path: Path, version: str) -> None:
    with scratch() as root, group_of_users(2, root) as (victim, attacker):
        project, secret = _project(root, victim.group), _secret(victim)
        lock_file = project / "x.lock"
        # 0.1 wrote its record to x.lock.holder, today's marker holding the record is x.lock.held.
        for name in ("x.lock.holder", "x.lock.held") if version == "0.1" else ("x.lock.held",):
            planted = attacker.run(["ln", "-s", str(secret), str(project / name)])
            assert planted.returncode == 0, planted.stderr
        env = sharedfs_before(root / "old") if version == "0.1" else {}  # where the users can read it
        if version == "0.1":  # the old marker name: the attacker's link sits where the record is written
            os.unlink(project / "x.lock.held")
        done = victim.run([sys.executable, "-c", VICTIM, str(lock_file), "2"], env=env, timeout=60)
        assert done.returncode == 0, done.stderr
        if version == "0.1":
            assert secret.read_text() != SECRET and '"pid"' in secret.read_text(), (done.stdout, done.stderr)
        else:
            assert secret.read_text() == SECRET  # never written through
            assert done.stdout.split() == ["refused", "LockTimeout"], done.stdout
            assert "x.lock.held is not a lock marker sharedfs wrote" in done.stderr, done.stderr


@pytest.mark.parametrize("version", ["0.1", "now"])
def test_a_fifo_planted_where_the_record_goes_never_hangs_the_victim(tmp_path: Path, version: str) -> None:
    with scratch() as root, group_of_users(2, root) as (victim, attacker):
        project = _project(root, victim.group)
        name = "x.lock.holder" if version == "0.1" else "x.lock.held"
        planted = attacker.run(["mkfifo", str(project / name)])
        assert planted.returncode == 0, planted.stderr
        env = sharedfs_before(root / "old") if version == "0.1" else {}  # where the users can read it
        if version == "0.1":
            # Opening the FIFO for writing blocks with the lock held: the victim never gets past it.
            with pytest.raises(subprocess.TimeoutExpired):
                victim.run([sys.executable, "-c", VICTIM, str(project / "x.lock"), "2"], env=env, timeout=15)
            return
        done = victim.run([sys.executable, "-c", VICTIM, str(project / "x.lock"), "2"], env=env, timeout=15)
        assert done.returncode == 0 and done.stdout.split() == ["refused", "LockTimeout"], (done.stdout, done.stderr)

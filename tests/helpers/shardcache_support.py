"""Support for the shard-cache tests: real throwaway users in a real group, and sharedfs as it was.

* :func:`group_of_users` makes a Unix group and users in it (``groupadd``/``useradd``), lets
  them run this checkout's interpreter (an ACL for the group on directories they could not
  traverse, e.g. pyenv under root's 0700 home), and removes all of it afterwards
  (:mod:`sharedfs.demo.accounts`, which the demo uses too).
* :func:`scratch` is a directory every user can reach (pytest's ``tmp_path`` is under a 0700
  directory of root's), removed afterwards.
* :func:`sharedfs_before` extracts sharedfs from :data:`BEFORE` -- the last commit before the
  shard cache's coordination files moved out of the cache -- so that a test can first show
  the failure it is about with the code that had it, run by the same interpreter and
  frameworks (``PYTHONPATH`` puts it, and an autoload module doing what its ``.pth`` did,
  before the installed checkout).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from harness.skips import skip_or_fail

from helpers.env import ROOT, clean_env
from sharedfs.demo import accounts

#: sharedfs before this change: coordination files in ``<cache>/.sharedfs``, a lock file per
#: shard, claims rewritten in place through their path, markers with no age limit.
BEFORE = "6175c79953ba9347fb2ff07c80b292a9b0021b86"


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int  # the user's own group
    group: int  # the shared group both users are in
    home: Path

    def _ids(self) -> dict[str, object]:
        return {"user": self.uid, "group": self.gid, "extra_groups": [self.group]}

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = clean_env({"HOME": str(self.home), "USER": self.name, "LOGNAME": self.name})
        env.update(extra or {})
        return env

    def run(self, argv: Sequence[str], *, env: dict[str, str] | None = None, umask: int = 0o002,
            timeout: float = 300, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` as this user (umask 002: a member of a project group sharing files).

        In a process group of its own: on a timeout the whole group is killed (a downloader's
        ``curl``, a DataLoader's workers), and cleanup can end strays without touching ours.
        """
        with self.popen(argv, env=env, umask=umask, cwd=cwd) as proc:
            try:
                out, err = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                out, err = proc.communicate()
                raise subprocess.TimeoutExpired(proc.args, timeout, out, err) from None
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def popen(self, argv: Sequence[str], *, env: dict[str, str] | None = None,
              umask: int = 0o002, cwd: str | None = None) -> subprocess.Popen[str]:
        return subprocess.Popen(list(argv), env=self.env(env), umask=umask, cwd=cwd or str(self.home), text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                **self._ids())  # type: ignore[call-overload]

    def python(self, code: str, *args: str, env: dict[str, str] | None = None,
               timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """``code`` in this checkout's interpreter (sharedfs autoloads, as in a user's job)."""
        return self.run([sys.executable, "-c", code, *args], env=env, timeout=timeout)


@contextmanager
def scratch(prefix: str = "sharedfs-test-") -> Iterator[Path]:
    """A directory (mode 0755, owned by root) that every user can reach; removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp" if os.path.isdir("/var/tmp") else None))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextmanager
def group_of_users(count: int, home_root: Path) -> Iterator[list[User]]:
    """A new group and ``count`` new users in it (homes under ``home_root``, mode 0700); removed afterwards.

    :func:`sharedfs.demo.accounts.group_of_users` (the demo's too), skipped where it cannot run
    (failed under CI); what could not be removed afterwards fails the test.
    """
    try:
        with accounts.group_of_users(count, home_root) as members:
            yield [User(m.name, m.uid, m.gid, m.group, m.home) for m in members]
    except accounts.UsersUnavailable as exc:
        skip_or_fail(str(exc))


def sharedfs_before(dest: Path) -> dict[str, str]:
    """Extract sharedfs at :data:`BEFORE` into ``dest``; the environment that makes processes use it."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        skip_or_fail("needs this repository's git history (git and .git) to run sharedfs as it was")
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", BEFORE, "sharedfs", "plugins", "shims"], check=False,
                             capture_output=True)
    if archive.returncode != 0:
        skip_or_fail(f"commit {BEFORE[:7]} is not in this clone: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    # The installed sharedfs.pth runs `import _sharedfs_bootstrap` at start-up (and importing it
    # installs it); on PYTHONPATH this one comes first and does what that version's .pth did:
    # import its package's own bootstrap and install it.  Importing the package here, before the
    # script's directory joins sys.path, also keeps a checkout in the working directory from
    # shadowing it.  install() is kept for the older .pth line that also called it.
    (dest / "_sharedfs_bootstrap.py").write_text(
        '"""The autoload of sharedfs at %s (its .pth imported the package itself)."""\n'
        "import sharedfs._bootstrap\n\n\n"
        "def install():\n"
        "    sharedfs._bootstrap.install()\n\n\n"
        "install()\n" % BEFORE[:7])
    for path in [dest, *dest.rglob("*")]:  # readable by the throwaway users too
        path.chmod(0o755 if path.is_dir() else 0o644)
    return {"PYTHONPATH": str(dest)}


def sharedfs_at(commit: str, dest: Path, fixes: Sequence[str] = ()) -> dict[str, str]:
    """sharedfs as it was at ``commit`` (package, plugins, shims, autoload module), first on ``PYTHONPATH``.

    ``fixes``: later commits of the kernel applied on top, for a bug the test is not about that would
    stop the old code before it shows the one it is (``patch``; a fix that does not apply fails the test).
    """
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        skip_or_fail("needs this repository's git history (git and .git) to run sharedfs as it was")
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "sharedfs", "plugins", "shims",
                              "_sharedfs_bootstrap.py"], check=False, capture_output=True)
    if archive.returncode != 0:
        skip_or_fail(f"commit {commit[:7]} is not in this clone: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    for fix in fixes:
        diff = subprocess.run(["git", "-C", str(ROOT), "show", "--format=", fix, "--", "sharedfs"], check=True,
                              capture_output=True).stdout
        subprocess.run(["patch", "-s", "-p1", "-d", str(dest)], input=diff, check=True)
    for part in ("plugins", "shims"):  # where a wheel installs them (sharedfs/__init__.py looks there first)
        (dest / part).rename(dest / "sharedfs" / part)
    for path in [dest, *dest.rglob("*")]:  # readable by the throwaway users too
        path.chmod(0o755 if path.is_dir() else 0o644)
    return {"PYTHONPATH": str(dest)}

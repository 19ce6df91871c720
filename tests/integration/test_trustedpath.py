"""``sharedfs.fs.trustedpath.resolve`` reaches the directory the kernel reaches, and judges a link by who could have put it there.

Real throwaway users (``group_of_users``): alice, the victim, and bob, a member of the same
project group, in a lab directory ``2775 root:<group>``.  Each case is resolved as alice, first
with sharedfs as it was before this change (:data:`BEFORE`, extracted from git and put first on
``PYTHONPATH``: the wrong answer), then with this checkout.

1. **``..`` after a planted link.**  bob plants ``team/hf -> ~alice/secret``.  The kernel (and
   ``os.path.realpath``) resolve ``team/hf/../proj`` past the link: ``~alice/secret/..`` is
   alice's home, so the framework writes into ``~alice/proj``.  ``resolve`` used to normalise
   ``..`` first (``os.path.abspath``) and answered ``team/proj`` with no planted link, so the
   team-cache rules judged a directory nobody writes to.
2. **A hard link of alice's own symlink, placed by bob in a sticky directory.**  With
   ``fs.protected_hardlinks=0`` (the kernel's default before 3.6, still set on some clusters),
   bob may hard-link alice's symlink into ``/tmp``-like ``1777`` directory: the name is bob's
   doing, the link is alice's.  ``resolve`` used to trust it as hers.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from harness.skips import skip_or_fail
from helpers.shardcache_support import User, group_of_users, scratch, sharedfs_at

#: sharedfs before this change: ``resolve`` normalised ``..`` before looking at symlinks, and trusted
#: any link of the user's own in a sticky directory.
BEFORE = "4e53bb2dc6566e8d50e2cfb3c29e3af5e275f8e7"

RESOLVE = """
import json, os, sys
import sharedfs.fs.trustedpath as trustedpath
out = {"module": trustedpath.__file__}
for path in sys.argv[1:]:
    found = trustedpath.resolve(path)
    out[path] = [found.real, os.path.realpath(path), found.planted and found.planted.link,
                 found.planted and found.planted.why()]
print(json.dumps(out))
"""


def _resolve(user: User, paths: list[str], env: dict[str, str] | None = None, cwd: str | None = None) -> dict:
    done = user.run([sys.executable, "-c", RESOLVE, *paths], env=env, cwd=cwd)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _as(user: User, script: str) -> None:
    done = user.run(["sh", "-c", "set -e\n" + script])
    assert done.returncode == 0, done.stderr


@pytest.fixture
def lab() -> Iterator[tuple[Path, User, User, dict[str, str]]]:
    """(the lab directory ``2775 root:<group>``, alice, bob, the environment that runs sharedfs as it was)."""
    with scratch("sharedfs-trustedpath-") as base, group_of_users(2, base) as (alice, bob):
        team = base / "team"
        team.mkdir()
        os.chown(team, 0, alice.group)
        team.chmod(0o2775)
        yield team, alice, bob, sharedfs_at(BEFORE, base / "before")


def test_dotdot_after_a_planted_link_is_resolved_past_the_link_as_the_kernel_does(lab) -> None:
    team, alice, bob, before = lab
    _as(alice, f'mkdir -p "{alice.home}/secret/proj" "{alice.home}/proj" "{team}/proj"')
    _as(bob, f'ln -s "{alice.home}/secret" "{team}/hf"')
    paths = [f"{team}/hf/../proj", f"{team}/hf/./../proj/new/x", f"{team}/proj/../hf/../proj"]

    old = _resolve(alice, paths, env=before)
    assert old.pop("module").startswith(before["PYTHONPATH"])
    print("before:", json.dumps(old))
    # The wrong answer: the planted link is skipped and a directory the kernel does not reach is named.
    assert old[paths[0]][:3] == [f"{team}/proj", f"{alice.home}/proj", None], old

    new = _resolve(alice, paths, env={})
    assert not new.pop("module").startswith(before["PYTHONPATH"])
    print("after:", json.dumps(new))
    for path in paths:
        real, kernel, link, why = new[path]
        assert real == kernel and real.startswith(f"{alice.home}/proj"), (path, new[path])
        assert link == f"{team}/hf" and why == f"it belongs to {bob.name} (uid {bob.uid})", (path, new[path])
    # Relative, from inside the lab, as a framework given "hf/../proj" would walk it.
    relative = _resolve(alice, ["hf/../proj"], env={}, cwd=str(team))
    assert relative["hf/../proj"][:3] == [f"{alice.home}/proj", f"{alice.home}/proj", f"{team}/hf"], relative


def test_dotdot_after_the_users_own_link_is_resolved_past_it_and_the_link_still_trusted(lab) -> None:
    team, alice, _, _ = lab
    _as(alice, f'mkdir -p "{alice.home}/.cache" "{team}/data/hf" && ln -s "{team}/data/hf" "{alice.home}/.cache/hf"')
    path = f"{alice.home}/.cache/hf/../other"
    found = _resolve(alice, [path], env={})
    assert found[path][:3] == [f"{team}/data/other", f"{team}/data/other", None], found


@contextmanager
def protected_hardlinks(value: str) -> Iterator[None]:
    """``fs.protected_hardlinks`` set to ``value`` for the block, restored after."""
    knob = Path("/proc/sys/fs/protected_hardlinks")
    try:
        saved = knob.read_text().strip()
        knob.write_text(value)
    except OSError as exc:
        skip_or_fail(f"cannot set fs.protected_hardlinks here ({exc.strerror}): the test needs it 0")
    try:
        yield
    finally:
        knob.write_text(saved)


def test_a_hard_link_of_the_users_symlink_placed_by_someone_else_in_a_sticky_directory_is_not_hers(lab) -> None:
    team, alice, bob, before = lab
    base = team.parent
    sticky = base / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    pub = base / "alice-pub"  # alice's own directory, that only she may write
    pub.mkdir()
    os.chown(pub, alice.uid, alice.gid)
    pub.chmod(0o755)
    _as(alice, f'mkdir -p "{team}/data" "{alice.home}/secret" && ln -s "{team}/data" "{pub}/hf" '
               f'&& ln -s "{team}/data" "{sticky}/alices-own"')
    with protected_hardlinks("0"):
        # bob gives alice's symlink a second name of his choosing (linkat without AT_SYMLINK_FOLLOW).
        _as(bob, f'ln -P "{pub}/hf" "{sticky}/bobs-name"')
    assert os.lstat(sticky / "bobs-name").st_uid == alice.uid and os.lstat(sticky / "bobs-name").st_nlink == 2
    paths = [f"{sticky}/bobs-name/proj", f"{sticky}/alices-own/proj", f"{pub}/hf/proj"]

    old = _resolve(alice, paths, env=before)
    old.pop("module")
    print("before:", json.dumps(old))
    assert old[paths[0]][2] is None, old  # the wrong answer: trusted as alice's own choice

    new = _resolve(alice, paths, env={})
    new.pop("module")
    print("after:", json.dumps(new))
    for path in paths:
        assert new[path][0] == new[path][1] == f"{team}/data/proj", new
    assert new[paths[0]][2] == f"{sticky}/bobs-name", new
    assert "2 names" in new[paths[0]][3], new
    assert new[paths[1]][2] is None and new[paths[2]][2] is None, new  # her own, made where only she could

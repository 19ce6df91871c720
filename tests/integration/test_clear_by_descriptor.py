"""A member who may rename a directory of her own inside a shared one turns path-based removals against others.

Real throwaway users (``group_of_users``): alice, the victim, and bob, the attacker, in one
project group.  bob owns ``sub/`` inside a shared directory (``2775 root:<group>``, or a sticky
``1777`` one) and fills it with markers of locks whose holders he SIGKILLed (genuinely dead);
beside it he puts ``link -> ~alice/priv``, alice's ``0700`` directory, which holds files with the
same names: half her data, half the markers of locks her running process holds.  Then he
exchanges ``sub`` and ``link`` with ``renameat2(RENAME_EXCHANGE)`` in a loop.

* Root runs ``sharedfs locks --clear-dead`` on the shared directory (what docs/cli.md tells an
  operator to do).  sharedfs as it was (:data:`BEFORE`) read, checked and unlinked by path, each
  step resolving ``sub`` again: root deleted alice's data files and live markers (two holders),
  and left break-turn files in her private directory.  Now every directory is opened from its
  parent's descriptor (``O_NOFOLLOW``, same device and inode as listed) and every file is
  checked and removed relative to it: nothing outside the tree is removed or created.
* ``sharedfs locks --json`` listed alice's private directory as ``<shared>/sub/...`` when the
  exchange came after the walk listed the shared directory; now that entry is skipped with a line.
* alice's own waiter, breaking bob's dead marker in ``sub``, unlinked by path too: it could be
  made to remove the marker of another lock alice holds.

Each attack runs first with :data:`BEFORE` (it must succeed: the test says what it broke), then
with this checkout (zero files of alice's removed or created over several runs of seconds).
"""

from __future__ import annotations

import ctypes.util
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import ROOT, clean_env
from helpers.shardcache_support import User, group_of_users, scratch, sharedfs_at

pytestmark = pytest.mark.slow

#: sharedfs before this change: `sharedfs locks` walked with os.scandir(path), and clears and waiters broke
#: markers with lstat(path) + unlink(path).
BEFORE = "4e53bb2dc6566e8d50e2cfb3c29e3af5e275f8e7"

#: Dead markers bob leaves (one killed holder takes them all), and files of alice's of the same names.
MARKERS = 300

#: Takes the soft locks ``<dir>/m<i>.lock`` for i in argv[2:] (as names), says so, then waits to be killed.
HOLDER = textwrap.dedent("""
    import sys, time, sharedfs
    locks = [sharedfs.lock(f"{sys.argv[1]}/{name}", kind="soft", timeout=30) for name in sys.argv[2:]]
    for lock in locks:
        lock.acquire()
    print("held", flush=True)
    time.sleep(3600)
""")

#: bob's loop: renameat2(RENAME_EXCHANGE) of argv[1] and argv[2] until argv[3] exists; how many exchanges.
EXCHANGER = textwrap.dedent("""
    import ctypes, os, sys, time
    libc = ctypes.CDLL(sys.argv[4], use_errno=True)
    a, b, stop = (p.encode() for p in sys.argv[1:4])
    AT_FDCWD, RENAME_EXCHANGE = -100, 2
    print("exchanging", flush=True)
    n = 0
    while not os.path.exists(stop):
        # Bursts of exchanges, then a pause with the names as they were: the walk gets into sub/ (and finds
        # work to do there) between bursts, and every step after that has a burst to race with.
        for _ in range(400):
            if libc.renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) == 0:
                n += 1
        if n % 2:
            n += libc.renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) == 0
        time.sleep(0.002)
    print(n, flush=True)
""")


@dataclass
class Scene:
    shared: Path  # the shared directory (2775 root:<group>, or 1777)
    sub: Path  # bob's directory in it, holding his dead markers
    link: Path  # bob's symlink to alice's private directory
    priv: Path  # alice's 0700 directory
    alice: User
    bob: User

    def names(self) -> list[str]:
        return [f"m{i:04d}.lock" for i in range(MARKERS)]

    def alices(self) -> dict[str, tuple[int, bytes]]:
        """Every file in alice's private directory: (inode, content)."""
        return {p.name: (p.stat().st_ino, p.read_bytes()) for p in self.priv.iterdir()}


def _ready(proc: subprocess.Popen[str], word: str) -> None:
    """Wait for ``proc`` to print ``word``; on anything else, what it said on stderr."""
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if line != word:
        proc.kill()
        _, err = proc.communicate(timeout=30)
        raise AssertionError(f"expected {word!r}, got {line!r}; stderr:\n{err[-3000:]}")


def _libc() -> str:
    found = ctypes.util.find_library("c")
    assert found, "libc not found"
    return found


@pytest.fixture(scope="module")
def people() -> Iterator[tuple[Path, User, User]]:
    with scratch("sharedfs-clear-") as root, group_of_users(2, root) as (alice, bob):
        for user in (alice, bob):
            user.home.chmod(0o755)  # a home others may enter (her private directory inside is 0700)
        yield root, alice, bob


def _scene(root: Path, alice: User, bob: User, label: str, mode: int) -> Scene:
    shared = root / label
    shared.mkdir()
    os.chown(shared, 0, alice.group)
    shared.chmod(mode)
    priv = alice.home / f"priv-{label}"
    scene = Scene(shared, shared / "sub", shared / "link", priv, alice, bob)
    done = alice.run(["mkdir", "-m", "700", str(priv)])
    assert done.returncode == 0, done.stderr
    done = bob.run(["mkdir", "-m", "2775", str(scene.sub)])  # a team subdirectory: members break dead locks there
    assert done.returncode == 0, done.stderr
    done = bob.run(["ln", "-s", str(priv), str(scene.link)])
    assert done.returncode == 0, done.stderr
    return scene


def _alice_holds(scene: Scene, env: dict[str, str]) -> subprocess.Popen[str]:
    """alice's files named like bob's markers: data files for even i, live markers (her holder runs) for odd i."""
    names = scene.names()
    for i, name in enumerate(names):
        if i % 2 == 0:
            done = scene.alice.run(["sh", "-c", f'printf "alice data {i}" > "$1"', "-", f"{scene.priv}/{name}.held"])
            assert done.returncode == 0, done.stderr
    holder = scene.alice.popen([sys.executable, "-c", HOLDER, str(scene.priv), *names[1::2]], env=env)
    _ready(holder, "held")
    return holder


def _bob_leaves_dead_markers(scene: Scene, env: dict[str, str]) -> None:
    """bob takes every lock in sub/ and is SIGKILLed: genuinely dead markers."""
    holder = scene.bob.popen([sys.executable, "-c", HOLDER, str(scene.sub), *scene.names()], env=env)
    _ready(holder, "held")
    os.killpg(holder.pid, 9)
    holder.wait()
    assert len(list(scene.sub.glob("*.held"))) == MARKERS


def _exchanging(scene: Scene, stop: Path) -> subprocess.Popen[str]:
    proc = scene.bob.popen([sys.executable, "-I", "-S", "-c", EXCHANGER, str(scene.sub), str(scene.link), str(stop),
                            _libc()], env={})
    _ready(proc, "exchanging")
    return proc


def _stop(proc: subprocess.Popen[str], stop: Path) -> int:
    stop.touch()
    out, err = proc.communicate(timeout=60)
    stop.unlink()
    assert proc.returncode == 0, err
    return int(out.split()[-1])


def _env(variant: str, before: dict[str, str]) -> dict[str, str]:
    env = {"SHAREDFS_NODE_ID": "node1"}
    return {**env, **before} if variant == "before" else env


@pytest.fixture(scope="module")
def before(people: tuple[Path, User, User]) -> dict[str, str]:
    root = people[0]
    return sharedfs_at(BEFORE, root / "before")


def _second_holders(scene: Scene, env: dict[str, str]) -> int:
    """An honest second process of alice's: how many of the locks her running holder holds it takes at once."""
    taken = scene.alice.python(textwrap.dedent("""
        import sys, sharedfs
        n = 0
        for name in sys.argv[2:]:
            lock = sharedfs.lock(f"{sys.argv[1]}/{name}", kind="soft", timeout=0)
            try:
                lock.acquire()
            except sharedfs.LockTimeout:
                continue
            n += 1
            lock.release()
        print(n)
    """), str(scene.priv), *scene.names()[1::2], env=env)
    assert taken.returncode == 0, taken.stderr
    return int(taken.stdout.split()[-1])


@pytest.mark.parametrize("mode", [0o2775, 0o1777], ids=["group-2775", "sticky-1777"])
def test_roots_clear_under_an_exchanging_parent_removes_nothing_outside_its_tree(people, before, mode) -> None:
    root, alice, bob = people
    outcome = {}
    for variant in ("before", "fixed"):
        removed: list[str] = []
        created: list[str] = []
        cleared = runs = exchanges = twice = 0
        deadline = time.monotonic() + 30
        # At least 3 runs of several seconds; against sharedfs as it was, until the attack succeeds once.
        while runs < 3 or (variant == "before" and not (removed or created) and time.monotonic() < deadline):
            runs += 1
            scene = _scene(root, alice, bob, f"{variant}-{mode:o}-{runs}", mode)
            env = _env(variant, before)
            holder = _alice_holds(scene, env)
            try:
                kept = scene.alices()
                _bob_leaves_dead_markers(scene, env)
                stop = root / f"stop-{variant}-{mode:o}"
                exchanger = _exchanging(scene, stop)
                try:
                    started = time.monotonic()
                    done = subprocess.run([sys.executable, "-m", "sharedfs", "locks", "--clear-dead", "--json",
                                           str(scene.shared)], capture_output=True, text=True, timeout=300,
                                          env=clean_env(env), cwd="/")
                finally:
                    exchanges += _stop(exchanger, stop)
                assert done.stdout, done.stderr
                cleared += sum(1 for row in json.loads(done.stdout) if row.get("cleared"))
                now = scene.alices()
                removed += [name for name, was in kept.items() if now.get(name) != was]
                created += sorted(set(now) - set(kept))
                twice += _second_holders(scene, env)
                if variant == "fixed" and runs == 1:
                    # Without the attack, the same clear removes every dead marker of bob's (and only those).
                    again = subprocess.run([sys.executable, "-m", "sharedfs", "locks", "--clear-dead", "--json",
                                            str(scene.shared)], capture_output=True, text=True, timeout=300,
                                           env=clean_env(env), cwd="/")
                    assert again.returncode == 0, again.stderr
                    assert not list(scene.sub.glob("*.held*")) and scene.alices() == kept
                print(f"{variant} {mode:o} run {runs}: {time.monotonic() - started:.1f} s, {exchanges} exchanges, "
                      f"{cleared} cleared so far; alice lost {len(removed)} files, {len(created)} appeared in her "
                      f"directory, {twice} of her held locks taken by a second process")
            finally:
                os.killpg(holder.pid, 9)
                holder.wait()
        outcome[variant] = (removed, created, cleared, twice)
    removed, created, cleared, twice = outcome["before"]
    assert removed or created, "the attack did not succeed against sharedfs as it was: the test shows nothing"
    removed, created, cleared, twice = outcome["fixed"]
    assert not removed and not created and twice == 0, outcome["fixed"]


def test_the_walk_never_lists_a_directory_swapped_in_after_its_parents_listing(people, before) -> None:
    root, alice, bob = people
    seen = {}
    for variant in ("before", "fixed"):
        escaped = runs = 0
        deadline = time.monotonic() + 30
        while runs < 3 or (variant == "before" and not escaped and time.monotonic() < deadline):
            runs += 1
            scene = _scene(root, alice, bob, f"walk-{variant}-{runs}", 0o2775)
            env = _env(variant, before)
            holder = _alice_holds(scene, env)
            try:
                # Plenty for the walk to do in sub/, so the exchange lands between a listing and an open.
                _bob_leaves_dead_markers(scene, env)
                stop = root / f"stop-walk-{variant}"
                exchanger = _exchanging(scene, stop)
                try:
                    for _ in range(2):
                        done = subprocess.run([sys.executable, "-m", "sharedfs", "locks", "--json",
                                               str(scene.shared)], capture_output=True, text=True, timeout=300,
                                              env=clean_env(env), cwd="/")
                        assert done.stdout, done.stderr
                        # Rows of alice's live markers (her uid), reported as if they were in the tree.
                        escaped += sum(1 for row in json.loads(done.stdout)
                                       if (row.get("holder") or {}).get("uid") == alice.uid)
                        if variant == "fixed":
                            assert all(re.match(r"sharedfs locks: skipped ", line)
                                       for line in done.stderr.splitlines()), done.stderr
                finally:
                    _stop(exchanger, stop)
            finally:
                os.killpg(holder.pid, 9)
                holder.wait()
        seen[variant] = escaped
    print(f"rows of alice's private directory listed as the tree's: before {seen['before']}, fixed {seen['fixed']}")
    assert seen["before"] > 0, "the walk never escaped against sharedfs as it was: the test shows nothing"
    assert seen["fixed"] == 0


#: alice's waiter: for each name, acquire the soft lock in argv[1] (bob's dead marker there is broken), release.
#: (filelock's realpath of the lock's directory may itself fail mid-exchange: EINVAL, ELOOP.)
WAITER = textwrap.dedent("""
    import sys, sharedfs
    took = 0
    for name in sys.argv[2:]:
        lock = sharedfs.lock(f"{sys.argv[1]}/{name}", kind="soft", timeout=0.3)
        try:
            lock.acquire()
        except (sharedfs.LockTimeout, OSError):
            continue
        took += 1
        lock.release()
    print(took)
""")


@pytest.mark.long
def test_a_waiter_breaking_a_dead_marker_under_a_swapped_parent_removes_nothing_else(people, before) -> None:
    root, alice, bob = people
    lost = {}
    for variant in ("before", "fixed"):
        total: list[str] = []
        runs = 0
        deadline = time.monotonic() + 40
        while runs < 3 or (variant == "before" and not total and time.monotonic() < deadline):
            runs += 1
            scene = _scene(root, alice, bob, f"waiter-{variant}-{runs}", 0o2775)
            env = _env(variant, before)
            holder = _alice_holds(scene, env)
            try:
                kept = scene.alices()
                _bob_leaves_dead_markers(scene, env)
                stop = root / f"stop-waiter-{variant}"
                exchanger = _exchanging(scene, stop)
                try:
                    done = alice.python(WAITER, str(scene.sub), *scene.names(), env=env, timeout=300)
                finally:
                    _stop(exchanger, stop)
                assert done.returncode == 0, done.stderr
                now = scene.alices()
                total += [name for name, was in kept.items() if now.get(name) != was]
            finally:
                os.killpg(holder.pid, 9)
                holder.wait()
        lost[variant] = total
    print(f"files of alice's own removed by her waiter elsewhere: before {len(lost['before'])}, "
          f"fixed {len(lost['fixed'])}")
    assert lost["before"], "the waiter was never turned against alice's files: the test shows nothing"
    assert not lost["fixed"]


def test_the_clear_and_the_locks_break_path_make_no_removal_or_walk_by_path() -> None:
    """What the tests above show by attack, for every line: in `sharedfs locks` and the lock's marker protocol,
    no unlink, lstat or scandir is called on a path (only through sharedfs.fs.directory, relative to an open
    directory)."""
    by_path = re.compile(r"\bos\.(unlink|remove|rmdir|lstat|scandir|link|rename|replace)\(|shutil\.rmtree\(")
    for source in ("sharedfs/commands/lockfiles.py", "sharedfs/commands/lockwalk.py", "sharedfs/locks/markerfiles.py",
                   "sharedfs/locks/nativeprobe.py", "sharedfs/locks/rows.py",
                   "sharedfs/shardcache/coordination.py", "sharedfs/locks/_marker.py", "sharedfs/fs/recordfile.py"):
        hits = [f"{source}:{n}: {line.strip()}" for n, line in
                enumerate((ROOT / source).read_text().splitlines(), 1) if by_path.search(line)]
        assert not hits, "\n".join(hits)


def test_root_clears_only_what_the_dead_holders_owner_could_have_removed(people, before) -> None:
    """bob's lock, taken while alice's directory let the group write, then alice closed it (0755): bob could no
    longer remove his marker there, so root's clear, which acts for him, leaves it and says why (sharedfs as it
    was removed it: root may remove anything); alice, whose directory it is, clears it herself."""
    root, alice, bob = people
    left = {}
    for variant in ("before", "fixed"):
        env = _env(variant, before)
        place = alice.home / f"closed-{variant}"
        done = alice.run(["mkdir", "-m", "2775", str(place)])
        assert done.returncode == 0, done.stderr
        os.chown(place, alice.uid, alice.group)
        holder = bob.popen([sys.executable, "-c", HOLDER, str(place), "x.lock"], env=env)
        _ready(holder, "held")
        os.killpg(holder.pid, 9)
        holder.wait()
        place.chmod(0o755)
        done = subprocess.run([sys.executable, "-m", "sharedfs", "locks", "--clear-dead", str(place)],
                              capture_output=True, text=True, timeout=120, env=clean_env(env), cwd="/")
        left[variant] = (place / "x.lock.held").exists(), done
    assert left["before"][0] is False, "root's clear as it was did not remove it: the test shows nothing"
    kept, done = left["fixed"]
    assert kept and done.returncode == 2, (done.stdout, done.stderr)
    assert f"{bob.name} could not remove it from" in done.stderr, done.stderr
    by_alice = alice.run([sys.executable, "-m", "sharedfs", "locks", "--clear-dead", str(alice.home / "closed-fixed")],
                         env={"SHAREDFS_NODE_ID": "node1"})
    assert by_alice.returncode == 0, by_alice.stderr
    assert not (alice.home / "closed-fixed" / "x.lock.held").exists()

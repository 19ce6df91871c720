"""`sharedfs doctor` on a team directory while a member swaps its work directory: nothing outside it is touched.

Real throwaway users (``group_of_users``): alice, the victim, and bob, the attacker, in one project
group, and a team directory ``2775 root:<group>``: not sticky, so any member may rename any entry
in it, and ``fs.protected_symlinks`` (sticky world-writable directories only) does not apply.
doctor probes the directory inside a work directory of its own, ``.sharedfs-probe-...``.  bob's
loop watches the team directory; the moment doctor's work directory appears he renames it away and
puts in its place

* **links**: a directory of his own holding symlinks named as the probe's files: ``fsync`` to a
  0600 file of root's (alice's own private file when she runs doctor), ``link-src`` and
  ``rename-target`` to alice's ``.bashrc``.  sharedfs as it was (:data:`BEFORE`) opened every
  file by path, following links: root's doctor truncated its own file to 4096 random bytes and
  wrote into alice's ``.bashrc``;
* **results**: alice's results directory (five checkpoints).  sharedfs as it was made its files
  there and ``shutil.rmtree``'d it by path at the end: her checkpoints were gone.

Each attack runs :data:`RUNS` times with :data:`BEFORE` (it must succeed: the test prints how
often), then as many times with this checkout: the work directory is made and opened once (``0700``,
``O_NOFOLLOW``, checked to be the one made), every check works relative to its descriptor, and it is
emptied by descriptor: nothing of root's or alice's changes and nothing is created in bob's or
alice's directories.  A last test swaps the work directory while a lock call hangs (an
``LD_PRELOAD`` flock that never returns, as on a dead NFS lock daemon): the worker started after
the hang must not reopen what is at the name now.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from harness.skips import skip_or_fail
from helpers import clean_env
from helpers.shardcache_support import User, group_of_users, scratch, sharedfs_at

pytestmark = pytest.mark.slow

#: sharedfs before this change: the probe's worker opened, linked, renamed and removed by path (rmtree).
BEFORE = "18c02b80ce3b03e9547d268701a4c5939cb3ba67"
RUNS = 5
CHECKPOINTS = 5
PREFIX = ".sharedfs-probe-"

#: bob's loop: in argv[1] (the team directory), rename every new work directory of doctor's away and put
#: argv[2] in its place: "links" (a directory of his with the symlinks name=target in argv[5:]) or the
#: directory argv[4] (alice's results); until argv[3] exists.  Prints how many it swapped.
SWAPPER = textwrap.dedent("""
    import os, sys, time
    team, mode, stop, results = sys.argv[1:5]
    links = [pair.split("=", 1) for pair in sys.argv[5:]]
    seen, swaps = set(), 0
    print("watching", flush=True)
    while not os.path.exists(stop):
        for entry in os.scandir(team):
            if not entry.name.startswith(%r) or entry.name in seen:
                continue
            seen.add(entry.name)
            try:
                os.rename(entry.path, os.path.join(team, f"moved-{len(seen)}"))
            except OSError:
                continue
            try:  # doctor may have made the name again first: that round is lost, not the loop
                if mode == "links":
                    os.mkdir(entry.path, 0o755)
                    for name, target in links:
                        os.symlink(target, os.path.join(entry.path, name))
                else:
                    os.rename(results, entry.path)
            except OSError:
                continue
            swaps += 1
        time.sleep(0.0005)
    print(swaps, flush=True)
""" % PREFIX)

#: bob's symlinks in "links" mode: probe file name -> which victim ("private" is root's, or alice's own).
LINKS = {"fsync": "private", "link-src": "bashrc", "rename-target": "bashrc"}


@dataclass
class Scene:
    root: Path
    team: Path
    alice: User
    bob: User
    runner: str  # "root" or "alice": who runs doctor

    @property
    def victims(self) -> dict[str, Path]:
        private = self.root / "root-secret" if self.runner == "root" else self.alice.home / "private"
        return {"private": private, "bashrc": self.alice.home / ".bashrc"}

    @property
    def results(self) -> Path:
        return self.team / "results"


@pytest.fixture(scope="module")
def people() -> Iterator[tuple[Path, User, User]]:
    with scratch("sharedfs-doctor-swap-") as root, group_of_users(2, root) as (alice, bob):
        yield root, alice, bob


@pytest.fixture(scope="module")
def before(people: tuple[Path, User, User]) -> dict[str, str]:
    return sharedfs_at(BEFORE, people[0] / "before")


def _scene(root: Path, alice: User, bob: User, label: str, runner: str) -> Scene:
    team = root / label
    team.mkdir()
    os.chown(team, 0, alice.group)
    team.chmod(0o2775)
    return Scene(root, team, alice, bob, runner)


def _write(path: Path, data: bytes, owner: User | None, mode: int) -> None:
    path.write_bytes(data)
    os.chown(path, owner.uid if owner else 0, owner.gid if owner else 0)
    path.chmod(mode)


def _victims(scene: Scene) -> dict[Path, bytes]:
    """Fresh victim files, and what they hold."""
    kept = {}
    for role, path in scene.victims.items():
        data = f"{role} of {'root' if path.parent == scene.root else 'alice'}: {os.urandom(8).hex()}\n".encode()
        _write(path, data, None if path.parent == scene.root else scene.alice, 0o600 if role == "private" else 0o644)
        kept[path] = data
    return kept


def _results(scene: Scene) -> tuple[int, dict[str, bytes]]:
    """alice's results directory (her own, 2775 in the team directory) with fresh checkpoints: (inode, files)."""
    shutil.rmtree(scene.results, ignore_errors=True)
    scene.results.mkdir()
    os.chown(scene.results, scene.alice.uid, scene.alice.group)
    scene.results.chmod(0o2775)
    kept = {}
    for i in range(CHECKPOINTS):
        kept[f"ckpt-{i}.pt"] = os.urandom(256)
        _write(scene.results / f"ckpt-{i}.pt", kept[f"ckpt-{i}.pt"], scene.alice, 0o664)
    return scene.results.stat().st_ino, kept


def _find(team: Path, inode: int) -> Path | None:
    """Where the directory ``inode`` is now in ``team`` (bob renames it), or None when it is gone."""
    for entry in os.scandir(team):
        if entry.inode() == inode:
            return Path(entry.path)
    return None


def _swapping(scene: Scene, mode: str, stop: Path) -> subprocess.Popen[str]:
    links = [f"{name}={scene.victims[role]}" for name, role in LINKS.items()]
    proc = scene.bob.popen([sys.executable, "-I", "-S", "-c", SWAPPER, str(scene.team), mode, str(stop),
                            str(scene.results), *links], env={})
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if line != "watching":
        proc.kill()
        raise AssertionError(f"bob's loop did not start: {line!r} {proc.communicate(timeout=30)[1][-2000:]}")
    return proc


def _stop(proc: subprocess.Popen[str], stop: Path) -> int:
    stop.touch()
    out, err = proc.communicate(timeout=60)
    stop.unlink()
    assert proc.returncode == 0, err
    return int(out.split()[-1])


def _doctor(scene: Scene, env: dict[str, str]) -> dict:
    argv = [sys.executable, "-m", "sharedfs", "doctor", "--json", str(scene.team)]
    if scene.runner == "root":
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=clean_env(env), cwd="/")
    else:
        done = scene.alice.run(argv, env=env, timeout=300)
    assert done.returncode == 0 and done.stdout, done.stderr[-3000:]
    (report,) = json.loads(done.stdout)["paths"]
    return report["probes"]


def _bobs_own(scene: Scene) -> list[Path]:
    """bob's swapped-in directories (owned by him, named like doctor's work directory)."""
    return [p for p in scene.team.iterdir() if p.name.startswith(PREFIX) and p.lstat().st_uid == scene.bob.uid]


def _run(scene: Scene, mode: str, env: dict[str, str], label: str) -> tuple[int, int, list[str]]:
    """RUNS doctor runs under bob's loop: (runs where something outside the work directory changed, swaps, notes)."""
    stop = scene.root / f"stop-{label}"
    hits, notes = 0, []
    swapper = _swapping(scene, mode, stop)
    try:
        for run in range(RUNS):
            if mode == "links":
                kept = _victims(scene)
                probes = _doctor(scene, env)
                changed = [str(path) for path, data in kept.items() if path.read_bytes() != data]
                # What doctor made in bob's directories (anything but his symlinks): opened through his swap.
                made = [str(p / name) for p in _bobs_own(scene) for name in os.listdir(p) if name not in LINKS]
            else:
                inode, kept_files = _results(scene)
                probes = _doctor(scene, env)
                where = _find(scene.team, inode)
                now = {p.name: p.read_bytes() for p in where.iterdir()} if where else {}
                changed = [name for name, data in kept_files.items() if now.get(name) != data]
                made = sorted(set(now) - set(kept_files))
            hits += bool(changed or made)
            notes.append(f"run {run}: changed {changed}, created {made}; probe error {probes['error']}, "
                         f"checks ok {sum(r['ok'] for r in probes['results'].values())}/{len(probes['results'])}, "
                         f"cleanup {probes['cleanup']['ok']} ({probes['cleanup']['detail']})")
            for path in _bobs_own(scene):  # bob starts each run afresh
                shutil.rmtree(path)
    finally:
        swaps = _stop(swapper, stop)
    return hits, swaps, notes


@pytest.mark.parametrize("runner", ["root", "alice"])
@pytest.mark.parametrize("mode", ["links", "results"])
def test_doctor_touches_nothing_outside_its_work_directory_while_a_member_swaps_it(people, before, runner,
                                                                                   mode) -> None:
    root, alice, bob = people
    counts = {}
    for variant, env in (("before", before), ("fixed", {})):
        label = f"{variant}-{runner}-{mode}"
        scene = _scene(root, alice, bob, label, runner)
        started = time.monotonic()
        hits, swaps, notes = _run(scene, mode, env, label)
        print(f"{label}: {hits} of {RUNS} runs touched something outside the work directory "
              f"({swaps} swaps, {time.monotonic() - started:.1f} s)", *notes, sep="\n  ")
        # Under load a doctor run can end before bob's loop sees its directory: most runs must be attacked.
        assert swaps > RUNS // 2, f"bob swapped {swaps} work directories in {RUNS} runs: the attack did not run"
        counts[variant] = hits
    assert counts["before"] > 0, "the attack did not succeed against sharedfs as it was: the test shows nothing"
    assert counts["fixed"] == 0, counts


#: flock() that never returns, like a call to a dead NFS lock daemon: the probe kills that worker and goes on in a new one.
HANGING_FLOCK_C = r"""
#include <unistd.h>
int flock(int fd, int op) { (void)fd; (void)op; for (;;) pause(); }
"""

#: The probe alone (sharedfs as it was, or this checkout), run by root; its report on stdout.
PROBE = "import json, sys; from sharedfs.commands.probe import probe; print(json.dumps(probe(sys.argv[1], timeout=2)))"

#: bob, once: rename the work directory argv[1] to argv[2] and put his own there, with the symlinks name=target.
SWAP_ONCE = textwrap.dedent("""
    import os, sys
    os.rename(sys.argv[1], sys.argv[2])
    os.mkdir(sys.argv[1], 0o755)
    for name, target in (pair.split("=", 1) for pair in sys.argv[3:]):
        os.symlink(target, os.path.join(sys.argv[1], name))
""")


@pytest.fixture(scope="module")
def hanging_flock(people: tuple[Path, User, User]) -> str:
    if shutil.which("gcc") is None:
        skip_or_fail("gcc is needed to build the LD_PRELOAD library")
    build = people[0] / "hanging-flock"
    build.mkdir()
    (build / "flock.c").write_text(HANGING_FLOCK_C)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", str(build / "libflock.so"), str(build / "flock.c")],
                   check=True)
    return str(build / "libflock.so")


def _hung_in(team: Path, deadline: float = 60.0) -> Path:
    """The work directory whose worker hangs in flock (its flock.lock exists)."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        for entry in os.scandir(team):
            if entry.name.startswith(PREFIX) and os.path.lexists(os.path.join(entry.path, "flock.lock")):
                return Path(entry.path)
        time.sleep(0.01)
    raise AssertionError(f"no work directory with a flock.lock appeared in {team}")


def test_the_worker_after_a_hung_lock_call_does_not_reopen_a_swapped_work_directory(people, before,
                                                                                   hanging_flock) -> None:
    root, alice, bob = people
    touched = {}
    for variant, env in (("before", before), ("fixed", {})):
        scene = _scene(root, alice, bob, f"hang-{variant}", "root")
        kept = _victims(scene)
        probe = subprocess.Popen([sys.executable, "-c", PROBE, str(scene.team)], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, cwd="/",
                                 env=clean_env({**env, "LD_PRELOAD": hanging_flock}))
        try:
            workdir = _hung_in(scene.team)
            links = [f"{name}={scene.victims[role]}" for name, role in LINKS.items()]
            done = bob.run([sys.executable, "-I", "-S", "-c", SWAP_ONCE, str(workdir), str(scene.team / "moved"),
                            *links], env={})
            assert done.returncode == 0, done.stderr
            out, err = probe.communicate(timeout=120)
        finally:
            probe.kill()
        assert probe.returncode == 0, err[-3000:]
        report = json.loads(out)
        changed = [str(path) for path, data in kept.items() if path.read_bytes() != data]
        made = sorted(set(os.listdir(workdir)) - set(LINKS)) if workdir.is_dir() else []
        print(f"{variant}: changed {changed}, created in bob's directory {made}; after the hang:",
              {name: result["errno"] or result["ok"] for name, result in report["results"].items()},
              f"cleanup: {report['cleanup']['detail']}")
        assert report["results"]["flock"]["timed_out"], report["results"]["flock"]
        touched[variant] = changed + made
        if variant == "fixed":  # every later step refused the directory at that name, and said why
            later = [name for name in report["results"] if name not in ("flock", "flock_excludes")]
            assert all(report["results"][name]["errno"] == "ESTALE" for name in later), report["results"]
            assert not report["cleanup"]["ok"] and "nothing was removed" in report["cleanup"]["detail"]
    assert touched["before"], "the swap after the hang did not succeed against sharedfs as it was: it shows nothing"
    assert touched["fixed"] == [], touched["fixed"]

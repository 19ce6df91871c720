"""`sharedfs doctor --cross-node` on a team directory: a member's planted or swapped meeting place touches nothing.

Real throwaway users (``group_of_users``): alice, the victim, and bob, the attacker, in one project
group, and a team directory ``2775 root:<group>``: not sticky, so any member may rename any entry in
it.  The cross-node probe's tasks (one per node: two processes here, told apart by
``SHAREDFS_NODE_ID`` as ``srun`` tasks on two nodes are) meet in ``.sharedfs-crossnode-<job>.<step>``,
a name every member can know in advance.  bob puts at that name, **before** the run (``planted``) or
the moment the meeting place appears (``swapped``: he renames it away first)

* **links**: a directory of his own holding symlinks named as the probe's files (``appear.<node>``
  to a 0600 file of root's -- alice's own private file when she runs doctor -- and to alice's
  ``.bashrc``; ``flock.lck`` to a name nobody made yet), plus forged ``hello@<node>`` posts so the
  tasks carry on there.  sharedfs as it was (:data:`BEFORE`) made, wrote and opened every file by
  path, following links: root's doctor overwrote its own secret and alice's ``.bashrc`` and created
  a file through the dangling link;
* **results**: alice's results directory (five checkpoints; ``private``: the same, ``0700``, so it is
  hers and nobody else's, as a meeting place is).  sharedfs as it was met there and
  ``shutil.rmtree``'d it by path at the end: her checkpoints were gone.

Each attack runs :data:`RUNS` times with :data:`BEFORE` (it must succeed: the test prints how
often), then as many times with this checkout: the meeting place is made ``0700`` and opened once
(``O_NOFOLLOW``), used only if private, the job user's and (for the tasks that did not make it)
holding the record of the job step; every file is made, read and renamed relative to its
descriptor, and it is emptied by descriptor and removed only while its name is still it.  Nothing
of root's or alice's changes and nothing is made in bob's or alice's directories; a refused place
is one line naming ``chmod +t``.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import clean_env
from helpers.shardcache_support import User, group_of_users, scratch, sharedfs_at

pytestmark = pytest.mark.slow

#: sharedfs before this change: the meeting place was mkdir'd (an existing one used as found), its files
#: made and opened by path, and rmtree'd by path.
BEFORE = "18c02b80ce3b03e9547d268701a4c5939cb3ba67"
RUNS = 5
CHECKPOINTS = 5
JOB = "77"
NODES = ("a", "b")
PREFIX = f".sharedfs-crossnode-{JOB}."
#: Seconds the tasks wait for each other: refused or stranded runs end this late.
TIMEOUT = 4

#: bob's loop: in argv[1] (the team directory), rename every new meeting place away and put argv[2] in its
#: place: "links" (a directory of his with the symlinks name=target in argv[5:]) or the directory argv[4]
#: (alice's results); in either he forges every node's hello post.  Until argv[3] exists; prints its swaps.
SWAPPER = textwrap.dedent("""
    import os, re, sys, time
    team, mode, stop, results = sys.argv[1:5]
    links = [pair.split("=", 1) for pair in sys.argv[5:]]
    seen, swaps = set(), 0
    print("watching", flush=True)
    while not os.path.exists(stop):
        for entry in os.scandir(team):
            if not re.fullmatch(%r, entry.name) or entry.name in seen:
                continue
            seen.add(entry.name)
            try:
                os.rename(entry.path, os.path.join(team, f"moved-{len(seen)}"))
            except OSError:
                continue
            try:
                if mode == "links":
                    os.mkdir(entry.path, 0o777)
                else:
                    os.rename(results, entry.path)
            except OSError:
                continue  # a task made the name again first: no swap this time
            # The tasks go on at once, in whatever is at the name now: a name they made first stays theirs.
            for name, target in links if mode == "links" else []:
                try:
                    os.symlink(target, os.path.join(entry.path, name))
                except FileExistsError:
                    pass
            for node in %r:
                try:
                    with open(os.path.join(entry.path, f"hello@{node}"), "x") as forged:
                        forged.write("null")
                except OSError:
                    pass  # a task's own post, or alice's private directory (0700): nothing to forge
            swaps += 1
        time.sleep(0.0005)
    print(swaps, flush=True)
""" % (re.escape(PREFIX) + r"\d+", NODES))

#: bob, once, before the run: put argv[2] at the meeting place's name argv[1] (as SWAPPER does, no forgery).
PLANT = textwrap.dedent("""
    import os, sys
    place, mode, results = sys.argv[1:4]
    if mode == "links":
        os.mkdir(place, 0o777)
        for name, target in (pair.split("=", 1) for pair in sys.argv[4:]):
            os.symlink(target, os.path.join(place, name))
    else:
        os.rename(results, place)
""")

#: bob's symlinks in "links" mode: file name -> which victim ("private" is root's, or alice's own; "created"
#: names nothing yet: a file made through it is one made where the runner never asked).
LINKS = {"appear.a": "private", "appear.b": "bashrc", "flock.lck": "created", "posix.lck": "created"}
FORGED = {f"hello@{node}" for node in NODES}

_steps = itertools.count()


@dataclass
class Scene:
    root: Path
    team: Path
    alice: User
    bob: User
    runner: str  # "root" or "alice": who runs doctor

    @property
    def victims(self) -> dict[str, Path]:
        home = self.alice.home
        if self.runner == "root":
            return {"private": self.root / "root-secret", "bashrc": home / ".bashrc",
                    "created": self.root / "created-through-a-link"}
        return {"private": home / "private", "bashrc": home / ".bashrc", "created": home / "created-through-a-link"}

    @property
    def results(self) -> Path:
        return self.team / "results"

    @property
    def links(self) -> list[str]:
        return [f"{name}={self.victims[role]}" for name, role in LINKS.items()]


@pytest.fixture(scope="module")
def people() -> Iterator[tuple[Path, User, User]]:
    with scratch("sharedfs-crossnode-swap-") as root, group_of_users(2, root) as (alice, bob):
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
    """Fresh victim files, and what they hold (the "created" one: nothing, it must not exist)."""
    kept = {}
    for role, path in scene.victims.items():
        if role == "created":
            path.unlink(missing_ok=True)
            continue
        owner = None if path.parent == scene.root else scene.alice
        data = f"{role} of {'root' if owner is None else 'alice'}: {os.urandom(8).hex()}\n".encode()
        _write(path, data, owner, 0o600 if role == "private" else 0o644)
        kept[path] = data
    return kept


def _results(scene: Scene, mode: int = 0o2775) -> tuple[int, dict[str, bytes]]:
    """alice's results directory (her own, 2775 or 0700, in the team directory) with fresh checkpoints:
    (inode, files)."""
    shutil.rmtree(scene.results, ignore_errors=True)
    scene.results.mkdir()
    os.chown(scene.results, scene.alice.uid, scene.alice.group)
    scene.results.chmod(mode)
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
    proc = scene.bob.popen([sys.executable, "-I", "-S", "-c", SWAPPER, str(scene.team), mode, str(stop),
                            str(scene.results), *scene.links], env={})
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


def _cross_node(scene: Scene, env: dict[str, str], step: int) -> list[tuple[int, str]]:
    """Both nodes' tasks of the real ``sharedfs doctor --cross-node`` CLI, run by the scene's runner at once:
    (exit status, first line of stderr) of each."""
    argv = [sys.executable, "-m", "sharedfs", "doctor", "--cross-node", "--json", "--timeout", str(TIMEOUT),
            str(scene.team)]
    tasks = []
    for node in NODES:
        task_env = {**env, "SLURM_JOB_ID": JOB, "SLURM_STEP_ID": str(step), "SLURM_STEP_NUM_NODES": str(len(NODES)),
                    "SHAREDFS_NODE_ID": node}
        if scene.runner == "root":
            tasks.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/",
                                          env=clean_env(task_env)))
        else:
            tasks.append(scene.alice.popen(argv, env=task_env))
    ended = []
    for task in tasks:
        try:
            _out, err = task.communicate(timeout=120)
        finally:
            task.kill()
        assert "Traceback" not in err, err[-3000:]
        ended.append((task.returncode, (err.splitlines() or [""])[0]))
    return ended


def _bobs_own(scene: Scene) -> list[Path]:
    """bob's planted or swapped-in directories (owned by him, named like the meeting place)."""
    return [p for p in scene.team.iterdir() if p.name.startswith(PREFIX) and p.lstat().st_uid == scene.bob.uid]


def _run(scene: Scene, mode: str, when: str, env: dict[str, str], label: str) -> tuple[int, int, list[str]]:
    """RUNS probes under bob's attack: (runs where something outside the meeting place changed, attacks made, notes)."""
    stop = scene.root / f"stop-{label}"
    hits, attacks, notes = 0, 0, []
    swapper = _swapping(scene, mode, stop) if when == "swapped" else None
    try:
        for run in range(RUNS):
            step = next(_steps)
            kept = _victims(scene)
            inode, kept_files = _results(scene, 0o700 if mode == "private" else 0o2775)
            if when == "planted":
                planted = scene.bob.run([sys.executable, "-I", "-S", "-c", PLANT, str(scene.team / f"{PREFIX}{step}"),
                                         mode, str(scene.results), *scene.links], env={})
                assert planted.returncode == 0, planted.stderr
                attacks += 1
            ended = _cross_node(scene, env, step)
            changed = [str(path) for path, data in kept.items() if path.read_bytes() != data]
            changed += [str(path) for role, path in scene.victims.items() if role == "created" and path.exists()]
            if mode == "links":
                # What doctor made in bob's directories (anything but his links and forgeries): made through his swap.
                made = [str(p / name) for p in _bobs_own(scene) for name in os.listdir(p)
                        if name not in LINKS and name not in FORGED]
            else:
                where = _find(scene.team, inode)
                now = {p.name: p.read_bytes() for p in where.iterdir()} if where else {}
                changed += [f"results/{name}" for name, data in kept_files.items() if now.get(name) != data]
                made = sorted(set(now) - set(kept_files) - FORGED)
            hits += bool(changed or made)
            notes.append(f"run {run}: changed {changed}, created {made}; tasks ended {ended}")
            for path in scene.team.iterdir():  # bob's directories and the moved meeting places: each run afresh
                if path.name == "results":
                    continue
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
    finally:
        if swapper is not None:
            attacks = _stop(swapper, stop)
    return hits, attacks, notes


@pytest.mark.parametrize("runner", ["root", "alice"])
# A private directory swapped in mid-run: bob cannot forge posts in it, so the tasks of sharedfs as it was wait
# apart until their timeout as often as not (nothing to show); planted, it is used, and rmtree'd, every time.
@pytest.mark.parametrize(("mode", "when"), [("links", "planted"), ("links", "swapped"), ("results", "planted"),
                                            ("results", "swapped"), ("private", "planted")])
def test_cross_node_doctor_touches_nothing_outside_its_meeting_place(people, before, runner, when, mode) -> None:
    root, alice, bob = people
    counts = {}
    for variant, env in (("before", before), ("fixed", {})):
        label = f"{variant}-{runner}-{when}-{mode}"
        scene = _scene(root, alice, bob, label, runner)
        started = time.monotonic()
        hits, attacks, notes = _run(scene, mode, when, env, label)
        print(f"{label}: {hits} of {RUNS} runs touched something outside the meeting place "
              f"({attacks} {when}, {time.monotonic() - started:.1f} s)", *notes, sep="\n  ")
        assert attacks == RUNS, f"bob {when} {attacks} meeting places in {RUNS} runs: the attack did not run"
        counts[variant] = hits
        shutil.rmtree(scene.team)
    assert counts["before"] > 0, "the attack did not succeed against sharedfs as it was: the test shows nothing"
    assert counts["fixed"] == 0, counts


def test_a_refused_meeting_place_is_one_line_naming_the_fix(people) -> None:
    """bob's planted directory: both tasks stop at once, each with one line that says what and where, and
    ``chmod +t``; with the team directory sticky, bob can no longer rename alice's results to the name."""
    root, alice, bob = people
    scene = _scene(root, alice, bob, "one-line", "root")
    try:
        step = next(_steps)
        assert bob.run([sys.executable, "-I", "-S", "-c", PLANT, str(scene.team / f"{PREFIX}{step}"), "links",
                        str(scene.results), *scene.links], env={}).returncode == 0
        for status, line in _cross_node(scene, {}, step):
            assert status == 2, line
            assert line.startswith(f"sharedfs doctor --cross-node: {scene.team / f'{PREFIX}{step}'} is not a meeting "
                                   "place a task of this job made (it is mode "), line
            assert f"(`chmod +t {scene.team}` stops it)" in line, line
        shutil.rmtree(scene.team / f"{PREFIX}{step}")
        scene.team.chmod(0o3775)  # the fix: now only an entry's owner (or the directory's) may rename it
        _results(scene)
        moved = bob.run(["mv", str(scene.results), str(scene.team / f"{PREFIX}{next(_steps)}")])
        assert moved.returncode != 0 and "not permitted" in moved.stderr, moved
        assert all(status == 0 for status, _ in _cross_node(scene, {}, next(_steps)))
        assert sorted(os.listdir(scene.team)) == ["results"], os.listdir(scene.team)
    finally:
        shutil.rmtree(scene.team)

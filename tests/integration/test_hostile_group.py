"""Hostile members of the victim's own group turn a team cache's paths against her; sharedfs must not help.

Real throwaway users (``group_of_users``): alice, the victim, and bob, the attacker, both in
one project group; a lab directory ``2775 root:<group>``; umask 022 for everyone.  Each attack
is run three times in the same test, in fresh directories: with the stock frameworks
(``SHAREDFS_DISABLE=1``: they never touch alice's files), with sharedfs as it was before
this change (:data:`PRE_FIX`, extracted from git and put first on ``PYTHONPATH``: the attack
succeeds, and the test says what it broke), and with this checkout (alice's files are
byte-for-byte and mode-for-mode intact, and a line on stderr says why).

1. **A symlinked team-cache root.**  With ``SHAREDFS_SHARED_GROUP`` set, bob makes the cache
   root a symlink to a directory of alice's (``ln -s ~alice/proj /team/hf/datasets``).  sharedfs
   used to trust ``realpath`` of the root, so ``~alice/proj`` became ``2775 alice:<group>``
   (and, for a WebDataset or wids ``cache_dir``, a group-writable ``~alice/.proj.sharedfs``
   appeared beside it): bob could then rename his own file over alice's.  A symlink is
   followed for team-cache purposes only when nobody but the user (or root) can have put it
   there; this one is refused for team treatment and the framework behaves as stock.
2. **A swapped sibling of a shard cache.**  alice reads through ``cache_dir=/team/wds``; bob
   renames the cache and its coordination tree away and renames alice's own
   ``/team/alice_results`` to ``/team/.wds.sharedfs``.  At exit, sharedfs's orphan cleanup used
   to ``rmtree`` that path because the cache was gone: alice's process deleted alice's
   ``model.pt``.  Now it removes only the very tree it created or opened (device and inode of
   a descriptor it held), by descriptor, and only names it makes there.
"""

from __future__ import annotations

import grp
import hashlib
import json
import os
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import require
from helpers.shardcache_support import User, group_of_users, scratch, sharedfs_at

from sharedfs.demo.shardserver import ShardServer, make_shards, wait_until

require("datasets", "needs datasets (scripts/requirements-test.txt)")
require("webdataset", "needs webdataset==1.0.2 (scripts/requirements-test.txt)")
require("wids", "needs wids==0.1.11 (scripts/requirements-test.txt)")

# xdist_group: the module's throwaway users and site, made once.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("test_hostile_group")]

#: sharedfs before this change: team-cache roots resolved with ``realpath`` and trusted; the shard
#: cache's orphan cleanup removed ``<parent>/.<cache>.sharedfs`` by path.
PRE_FIX = "b30334f6f6a57c899e4ef382c73a22ab23263a8f"

# alice's job: one framework reads through the cache at argv[2]; with argv[4] (a file name) it then
# waits for that file to appear before it exits (the attacker acts meanwhile).
JOB = textwrap.dedent("""
    import os, sys, time
    framework, cache, source = sys.argv[1:4]
    if framework == "datasets":
        import datasets
        datasets.disable_progress_bars()
        ds = datasets.load_dataset("json", data_files=source, split="train")  # HF_DATASETS_CACHE=cache
        result = sum(ds["x"])
    elif framework == "webdataset":
        import webdataset as wds
        os.makedirs(cache, exist_ok=True)  # webdataset wants it to exist
        result = sum(1 for _ in wds.WebDataset(source.split(","), cache_dir=cache, shardshuffle=False,
                                               empty_check=False))
    elif framework == "wids":
        import wids
        ds = wids.ShardListDataset([{"url": u, "nsamples": 5} for u in source.split(",")], cache_dir=cache)
        result = len({ds[i]["__key__"] for i in range(len(ds))})
    print(result, flush=True)
    if len(sys.argv) > 4:
        print("ready", flush=True)
        deadline = time.monotonic() + 120
        while not os.path.exists(sys.argv[4]) and time.monotonic() < deadline:
            time.sleep(0.05)
""")


@dataclass(frozen=True)
class Site:
    root: Path
    alice: User
    bob: User
    shards: ShardServer
    data: Path  # a JSON dataset every user may read
    before: dict[str, str]  # the environment that runs sharedfs as it was at PRE_FIX

    @property
    def group(self) -> str:
        return grp.getgrgid(self.alice.group).gr_name

    def urls(self, *numbers: int) -> str:
        return ",".join(f"http://127.0.0.1:{self.shards.port}/shard-{n:06d}.tar" for n in numbers)


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    with scratch("sharedfs-hostile-") as root, group_of_users(2, root) as (alice, bob):
        for user in (alice, bob):
            user.home.chmod(0o755)  # a home others may enter, as on most clusters
        make_shards(root / "src", count=3, samples=5)
        data = root / "data.json"
        data.write_text("".join(json.dumps({"x": i}) + "\n" for i in range(10)))
        for path in (root / "src", *(root / "src").iterdir(), data):
            path.chmod(0o755 if path.is_dir() else 0o644)
        before = sharedfs_at(PRE_FIX, root / "before")
        with ShardServer(root / "src") as shards:
            yield Site(root, alice, bob, shards, data, before)


VARIANTS = ("stock", "before", "fixed")


def env_of(site: Site, variant: str, **extra: str) -> dict[str, str]:
    env = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", **extra}
    if variant == "stock":
        env["SHAREDFS_DISABLE"] = "1"
    elif variant == "before":
        env.update(site.before)
    return env


def lab(site: Site, label: str) -> Path:
    """The lab's directory: ``2775 root:<group>``, where every member may create and rename entries."""
    team = site.root / label / "team"
    team.mkdir(parents=True)
    os.chown(team, 0, site.alice.group)
    team.chmod(0o2775)
    return team


def victims_directory(site: Site, name: str) -> Path:
    """A directory of alice's own, ``0755 alice:alice``, with a file and a private subdirectory in it."""
    proj = site.alice.home / name
    proj.mkdir(mode=0o755)
    (proj / "notes.txt").write_text("alice's notes\n")
    (proj / "private").mkdir(mode=0o700)
    (proj / "private" / "key").write_bytes(b"alice's key\n")
    (proj / "private" / "key").chmod(0o600)
    for path in (proj, *proj.rglob("*")):
        os.chown(path, site.alice.uid, site.alice.gid, follow_symlinks=False)
    return proj


def snapshot(top: Path) -> dict[str, tuple[str, int, int, int, str]]:
    """Every entry under ``top`` (``top`` as "."): kind, mode, owner, group and a digest of a file's bytes."""
    found = {}
    for path in (top, *top.rglob("*")):
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            kind, digest = "link", os.readlink(path)
        elif stat.S_ISDIR(st.st_mode):
            kind, digest = "dir", ""
        else:
            kind, digest = "file", hashlib.sha256(path.read_bytes()).hexdigest()[:16]
        found[str(path.relative_to(top))] = (kind, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, digest)
    return found


def as_user(user: User, argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return user.run(argv, env=env, umask=0o022, timeout=240)


# -- 1. a symlinked team-cache root ----------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    proj: Path
    before: dict[str, tuple[str, int, int, int, str]]  # alice's directory before her job
    after: dict[str, tuple[str, int, int, int, str]]  # and after it
    job: subprocess.CompletedProcess[str]
    bob_wrote: bool  # whether bob could then rename a file of his over alice's notes
    siblings: list[str]  # what appeared beside alice's directory

    def kept(self) -> dict[str, tuple[str, int, int, int, str]]:
        """What alice had before, as it is now."""
        return {name: self.after.get(name, ("gone", 0, 0, 0, "")) for name in self.before}


def symlinked_root(site: Site, framework: str, variant: str) -> Outcome:
    """bob plants ``<lab>/hf/<framework>`` -> ``~alice/proj-...``; alice's job uses it as its cache."""
    label = f"root-{framework}-{variant}"
    team = lab(site, label)
    proj = victims_directory(site, f"proj-{framework}-{variant}")
    link = team / "hf" / framework
    plant = as_user(site.bob, ["sh", "-c", f'mkdir "{team}/hf" && ln -s "{proj}" "{link}"'])
    assert plant.returncode == 0, plant.stderr  # the precondition: any member may do this
    home_before = set(os.listdir(site.alice.home))
    before = snapshot(proj)
    source = str(site.data) if framework == "datasets" else site.urls(0, 1)
    job = as_user(site.alice, [sys.executable, "-c", JOB, framework, str(link), source],
                  env=env_of(site, variant, SHAREDFS_SHARED_GROUP=site.group, HF_DATASETS_CACHE=str(link)))
    assert job.returncode == 0, job.stderr[-3000:]
    after = snapshot(proj)
    siblings = sorted(set(os.listdir(site.alice.home)) - home_before)
    # bob's follow-up: a file of his renamed over alice's notes (rename(2) needs write access to the directory).
    swap = as_user(site.bob, [sys.executable, "-I", "-S", "-c", textwrap.dedent("""
        import os, sys
        mine = os.path.join(sys.argv[1], ".bob")
        try:
            with open(mine, "w") as fh:
                fh.write("bob was here\\n")
            os.rename(mine, os.path.join(sys.argv[1], "notes.txt"))
            print("renamed")
        except PermissionError as exc:
            print(exc)
    """), str(proj)])
    bob_wrote = swap.stdout.strip() == "renamed"
    return Outcome(proj, before, after, job, bob_wrote, siblings)


@pytest.mark.parametrize("framework", ["datasets", "webdataset", "wids"])
def test_a_symlinked_team_cache_root_widened_the_victims_directory_and_no_longer_does(site, framework) -> None:
    stock, old, fixed = (symlinked_root(site, framework, variant) for variant in VARIANTS)
    answer = {"datasets": "45", "webdataset": "10", "wids": "10"}[framework]

    # Stock: the framework follows the symlink and writes its cache into alice's directory, with her umask.
    assert stock.job.stdout.split()[0] == answer
    assert stock.kept() == stock.before and not stock.bob_wrote and stock.siblings == []

    # sharedfs as it was: alice's directory became the group's, and bob could replace her files.
    top = old.after["."]
    print(f"{framework}, before the fix: ~alice/{old.proj.name} became {top[1]:o} gid {top[3]}; "
          f"bob renamed over her notes: {old.bob_wrote}; beside it: {old.siblings}")
    assert top[1] == 0o2775 and top[3] == site.alice.group
    assert old.bob_wrote
    if framework != "datasets":
        assert old.siblings == [f".{old.proj.name}.sharedfs"]
        sibling = old.proj.parent / old.siblings[0]
        assert sibling.stat().st_mode & stat.S_IWGRP and sibling.stat().st_gid == site.alice.group

    # Now: the same job works, alice's directory and files are exactly as they were, nothing appeared
    # beside it, bob can do nothing there, and stderr says why (the symlink, its owner, what to do).
    assert fixed.job.stdout.split()[0] == answer
    assert fixed.kept() == fixed.before
    assert not fixed.bob_wrote and fixed.siblings == []
    assert "symlink" in fixed.job.stderr and site.bob.name in fixed.job.stderr, fixed.job.stderr
    # And what the framework itself added there is what the stock framework adds, mode for mode (names
    # hold the cache's path and a fingerprint: compared by depth and suffix).  In a shard cache, sharedfs's
    # coordination tree is inside it: alice's, with her umask, nothing beside it.
    assert added(fixed) == added(stock), (added(fixed), added(stock))
    if framework != "datasets":
        tree = {name: entry for name, entry in fixed.after.items() if name.startswith(".sharedfs")}
        assert tree and all(uid == site.alice.uid and gid == site.alice.gid and not mode & 0o022
                            for _, mode, uid, gid, _ in tree.values()), tree


def added(run: Outcome) -> list[tuple[str, int, int, int, int, str]]:
    """What a job added to alice's directory: kind, mode, owner, group, depth and suffix of each entry."""
    return sorted((kind, mode, uid, gid, name.count("/"), os.path.splitext(name)[1])
                  for name, (kind, mode, uid, gid, _) in run.after.items()
                  if name not in run.before and not name.startswith(".sharedfs"))


# -- 2. a swapped sibling of a shard cache -----------------------------------------------------------------


def swapped_sibling(site: Site, framework: str, variant: str,
                    early: bool = False) -> tuple[dict, dict, subprocess.CompletedProcess[str]]:
    """alice reads through ``<lab>/wds``; bob then swaps ``<lab>/alice_results`` in as its sibling tree.

    ``early``: bob puts it there before alice's job starts, so that her job opens it as its tree.
    Returns alice's results directory before and after her job exited, and the job.
    """
    label = f"sibling-{framework}-{variant}{'-early' if early else ''}"
    team = lab(site, label)
    results = team / "alice_results"
    made = as_user(site.alice, ["sh", "-c", f'mkdir "{results}" && printf weights > "{results}/model.pt"'])
    assert made.returncode == 0, made.stderr
    before = snapshot(results)
    cache, sibling = team / "wds", team / ".wds.sharedfs"
    go = site.root / label / "go"
    if early:
        moved = as_user(site.bob, ["mv", str(results), str(sibling)])
        assert moved.returncode == 0, moved.stderr
        results = sibling
    proc = site.alice.popen([sys.executable, "-c", JOB, framework, str(cache), site.urls(0), str(go)],
                            env=env_of(site, variant), umask=0o022)
    try:
        assert wait_until(lambda: proc.poll() is not None or (cache / "shard-000000.tar").exists(), timeout=120)
        assert proc.poll() is None, proc.communicate()
        # bob cannot delete alice's directory (it is not empty and not his), but he may rename it.
        attack = as_user(site.bob, ["sh", "-c", textwrap.dedent(f"""
            set -e
            rm -rf "{results}" 2>/dev/null || true
            test -e "{results}/model.pt"
            mv "{cache}" "{team}/wds.old"
            if [ "{results}" != "{sibling}" ]; then
                if [ -e "{sibling}" ]; then mv "{sibling}" "{team}/.wds.old"; fi
                mv "{results}" "{sibling}"
            fi
        """)])
        assert attack.returncode == 0, attack.stderr
        go.touch()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    after = snapshot(sibling) if sibling.exists() else {}
    return before, after, subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize("framework", ["webdataset", "wids"])
def test_a_directory_swapped_in_as_the_shard_caches_sibling_was_deleted_at_exit_and_no_longer_is(
        site, framework) -> None:
    results = {variant: swapped_sibling(site, framework, variant) for variant in VARIANTS}

    before, after, job = results["stock"]
    assert job.stdout.split()[0] == "5"
    assert after == before  # the stock frameworks never remove anything beside their cache

    before, after, job = results["before"]
    print(f"{framework}, before the fix: alice's results after her own job exited: {after or 'deleted'}")
    assert job.stdout.split()[0] == "5" and after == {}

    before, after, job = results["fixed"]
    assert job.stdout.split()[0] == "5"
    assert after == before  # model.pt byte for byte, and every mode, owner and group
    assert "not the coordination directory this process" in job.stderr, job.stderr


# -- what stays trusted: the user's own symlinks ---------------------------------------------------------

RESOLVE = textwrap.dedent("""
    import json, os, sys
    from sharedfs.fs.trustedpath import resolve
    out = {}
    for path in sys.argv[1:]:
        found = resolve(path)
        out[path] = [found.real == os.path.realpath(path), found.planted and found.planted.link]
    print(json.dumps(out))
""")


def test_which_symlinks_are_the_users_own_choice(site) -> None:
    """Followed: the user's or root's symlink where nobody else may replace it.  Refused: anything else."""
    alice, bob = site.alice, site.bob
    base = site.root / "links"
    team = lab(site, "links")  # <root>/links/team, 2775 root:<group>
    target = team / "data"
    target.mkdir()
    sticky = base / "sticky"
    sticky.mkdir(mode=0o1777)
    sticky.chmod(0o1777)
    rootdir = base / "rootdir"
    rootdir.mkdir(mode=0o755)
    os.symlink(target, rootdir / "data")  # root's, in root's own directory: a site's /data -> /lustre/data
    upg = alice.home / "upg"  # alice:alice 0775 under the user-private-group convention: her group is hers alone
    setup = as_user(alice, ["sh", "-c", f"""
        set -e
        mkdir -p "{alice.home}/.cache" "{upg}" && chmod 0775 "{upg}"
        ln -s "{target}" "{alice.home}/.cache/hf"
        ln -s "{target}" "{team}/alices-link"
        ln -s "{target}" "{sticky}/alices-link"
        ln -s "{target}" "{upg}/hf"
        ln -s loop-b "{alice.home}/loop-a" && ln -s loop-a "{alice.home}/loop-b"
    """])
    assert setup.returncode == 0, setup.stderr
    planted = as_user(bob, ["sh", "-c", f"""
        set -e
        mkdir -m 0755 "{bob.home}/pub"
        ln -s "{target}" "{bob.home}/pub/bobs-link"
        ln -s "{target}" "{sticky}/bobs-link"
        ln -s "{alice.home}" "{team}/alice"
    """])
    assert planted.returncode == 0, planted.stderr
    # alice's own group must be hers alone for the user-private-group case (useradd --user-group)
    assert grp.getgrgid(alice.gid).gr_name == alice.name
    cases = {
        f"{alice.home}/.cache/hf": None,  # her own link in her own directory: ~/.cache/huggingface -> /scratch/...
        f"{alice.home}/.cache/hf/sub/dir": None,  # a path below it that does not exist yet
        f"{rootdir}/data": None,  # root's, in a directory only root may write
        f"{sticky}/alices-link": None,  # hers, in a sticky directory (/tmp): nobody else may replace it
        f"{upg}/hf": None,  # hers, in her directory that only her private group may also write
        f"{team}/alices-link": f"{team}/alices-link",  # hers, but in the lab's directory: any member may replace it
        f"{sticky}/bobs-link": f"{sticky}/bobs-link",  # bob's
        f"{bob.home}/pub/bobs-link": f"{bob.home}/pub/bobs-link",  # bob's, in bob's directory
        f"{team}/alice/proj-x": f"{team}/alice",  # a planted link on the way, not at the end
        f"{alice.home}/loop-a": "a loop",  # proves nothing: refused (at whichever link the count ran out)
    }
    result = as_user(alice, [sys.executable, "-c", RESOLVE, *cases])
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found[f"{alice.home}/loop-a"][1] in (f"{alice.home}/loop-a", f"{alice.home}/loop-b")
    found[f"{alice.home}/loop-a"][1] = "a loop"
    assert {path: found[path][1] for path in cases} == cases
    assert all(same for path, (same, _) in found.items() if "loop" not in path), found  # same as realpath


def test_the_users_own_symlink_to_a_team_cache_still_makes_it_the_teams(site) -> None:
    """``~/hf -> /team/hf``, alice's own link: what datasets makes there is the group's, as without a link.

    (sharedfs before this change climbed from the link's own directory, ``~``, and missed the
    lab's setgid directory: it did not share the cache at all, as stock.)
    """
    runs = {}
    for variant in VARIANTS:
        team = lab(site, f"ownlink-{variant}")
        link = site.alice.home / f"hf-{variant}"
        made = as_user(site.alice, ["sh", "-c", f'mkdir "{team}/hf" && ln -s "{team}/hf" "{link}"'])
        assert made.returncode == 0, made.stderr
        job = as_user(site.alice, [sys.executable, "-c", JOB, "datasets", str(link), str(site.data)],
                      env=env_of(site, variant, HF_DATASETS_CACHE=str(link / "datasets")))
        assert job.returncode == 0 and job.stdout.split()[0] == "45", job.stderr[-3000:]
        runs[variant] = snapshot(team / "hf" / "datasets")
    for variant in ("stock", "before"):  # under umask 022: 2755 directories the next member cannot add to
        assert [name for name, (kind, mode, *_rest) in runs[variant].items() if kind == "dir" and not mode & 0o020]
    shared = runs["fixed"]
    assert len(shared) == len(runs["stock"])
    assert all(gid == site.alice.group and mode & 0o060 == 0o060 for kind, mode, _, gid, _ in shared.values()
               if kind != "link"), shared
    assert "not treated as a team cache" not in job.stderr


@pytest.mark.parametrize("framework", ["webdataset", "wids"])
def test_a_directory_planted_as_the_sibling_before_first_use_keeps_the_victims_files(site, framework) -> None:
    """bob renames alice's directory to ``.wds.sharedfs`` before her job; her job uses it, then the cache goes."""
    before, after, job = swapped_sibling(site, framework, "before", early=True)
    print(f"{framework}, before the fix: alice's results after her own job exited: {after or 'deleted'}")
    assert job.stdout.split()[0] == "5" and after == {}

    before, after, job = swapped_sibling(site, framework, "fixed", early=True)
    assert job.stdout.split()[0] == "5"
    # Her job used it as its coordination tree (it was a directory where the tree belongs); at exit
    # only what sharedfs makes there went, and model.pt, which it never makes, kept the rest.
    assert after == before
    assert "which sharedfs does not make there" in job.stderr and "model.pt" in job.stderr, job.stderr

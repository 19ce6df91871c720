"""A member who may write a shard cache's parent swaps the cache for a symlink; eviction must not follow it.

Real throwaway users (``group_of_users``): alice, the victim, and bob, the attacker, in one project
group; a project directory ``2775 root:<group>`` (not sticky) holding alice's cache ``cache/``.
alice's job reads shards through real webdataset (``FileCache`` with a small ``cache_size``) or
real wids (``ShardListDataset``, then ``keep_most_recent_files``, what wids' cleanup process
runs), so that eviction runs.  Meanwhile bob renames ``cache`` away and puts a symlink to
alice's private ``0700`` directory at its name; that directory holds 12 files older than any shard.

* **While her job runs**: the next eviction -- webdataset's before its next download, wids'
  cleanup -- walks and unlinks by path, so it deletes her oldest private files until the
  "cache" fits: 6 of 12 with webdataset, 7 of 12 with wids (stock, ``SHAREDFS_DISABLE=1``, and
  sharedfs as it was, :data:`BEFORE`).  Now the cache is looked at and emptied only through
  its directory's descriptor, proven to be the directory the job used (device, inode, owner,
  ``O_NOFOLLOW``): the round is skipped with one line and nothing is deleted.
* **A cleanup process started after the swap** (wids' background cleanup, a second job): it
  never saw the real cache, and the symlink is bob's in a directory every member may write
  (:mod:`sharedfs.fs.trustedpath`): eviction through it is refused the same way.
* **No symlink**: bob renames alice's own ``results/`` (0700, beside the cache) to the cache's
  name.  Right owner, a real directory: only the device and inode the job holds tell it apart.
* **The coordination tree's** ``inuse/`` (group-writable, as the cache is) swapped for a
  symlink: sharedfs as it was swept all 12 files as dead readers' markers; stock has no such tree.

Each variant runs :data:`RUNS` times in fresh directories.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import require
from helpers.shardcache_support import User, group_of_users, scratch, sharedfs_at

from sharedfs.demo.shardserver import ShardServer, make_shards

require("webdataset", "needs webdataset==1.0.2 (scripts/requirements-test.txt)")
require("wids", "needs wids==0.1.11 (scripts/requirements-test.txt)")
require("torch", "needs torch==2.13.0: wids imports torch.distributed")

# xdist_group: the module's throwaway users, made once.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("test_shardcache_swap")]

#: sharedfs before this change: eviction walked the cache with os.walk and unlinked each shard by path.
BEFORE = "18c02b80ce3b03e9547d268701a4c5939cb3ba67"
#: alice's private files, and their size: the cache limit is six of them.
PRIVATE, SIZE = 12, 8192
LIMIT = 6 * SIZE
RUNS = 3
VARIANTS = ("stock", "before", "fixed")

# alice's job: read the shards argv[3][:-1] through the framework's cache at argv[2] (the limit is
# argv[4] bytes), say "ready", wait for the file argv[5], then evict as the framework does: webdataset
# before downloading the next shard (argv[3][-1], a miss), wids by its cleanup function.
JOB = textwrap.dedent("""
    import os, sys, time
    framework, cache, urls, limit, go = sys.argv[1], sys.argv[2], sys.argv[3].split(","), int(sys.argv[4]), sys.argv[5]
    if framework == "webdataset":
        import webdataset.cache as wcache
        fc = wcache.FileCache(cache_dir=cache, cache_size=limit, cache_cleanup_interval=0)
        for url in urls[:-1]:
            fc.get_file(url)
    else:
        import wids
        from wids.wids_cleanup import keep_most_recent_files
        ds = wids.ShardListDataset([{"url": u, "nsamples": 5} for u in urls[:-1]], cache_dir=cache)
        assert len({ds[i]["__key__"] for i in range(len(ds))}) == 5 * (len(urls) - 1)
    print("ready", flush=True)
    deadline = time.monotonic() + 120
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.02)
    if framework == "webdataset":
        try:
            fc.get_file(urls[-1])
        except PermissionError as exc:  # sharedfs: a download into a swapped cache is refused (one line)
            print(exc, file=sys.stderr)
    else:
        keep_most_recent_files(os.path.join(cache, "*"), maxsize=limit)
    print("done", flush=True)
""")

# A cleanup that starts after the swap: webdataset's LRUCleanup, or wids' keep_most_recent_files.
CLEANUP = textwrap.dedent("""
    import os, sys
    framework, cache, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if framework == "webdataset":
        from webdataset.cache import LRUCleanup
        LRUCleanup(cache, limit, interval=None).cleanup()
    else:
        from wids.wids_cleanup import keep_most_recent_files
        keep_most_recent_files(os.path.join(cache, "*"), maxsize=limit)
    print("done", flush=True)
""")


@dataclass(frozen=True)
class Site:
    root: Path
    alice: User
    bob: User
    shards: ShardServer
    before: dict[str, str]  # the environment that runs sharedfs as it was at BEFORE

    def urls(self, count: int) -> str:
        return ",".join(f"http://127.0.0.1:{self.shards.port}/shard-{n:06d}.tar" for n in range(count))

    def env(self, variant: str) -> dict[str, str]:
        return {"stock": {"SHAREDFS_DISABLE": "1"}, "before": self.before, "fixed": {"SHAREDFS_STRICT": "1"}}[variant]


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    with scratch("sharedfs-swap-") as root, group_of_users(2, root) as (alice, bob):
        make_shards(root / "src", count=3, samples=5)
        for path in (root / "src", *(root / "src").iterdir()):
            path.chmod(0o755 if path.is_dir() else 0o644)
        before = sharedfs_at(BEFORE, root / "before")
        with ShardServer(root / "src", max_seconds=1800) as shards:  # the module runs 5-10 minutes
            yield Site(root, alice, bob, shards, before)


@dataclass
class Scene:
    cache: Path  # <label>/proj/cache: alice's, 2775, in the 2775 root:<group> project directory
    private: Path  # ~alice/<label>: 0700, her 12 files
    go: Path  # the job waits for it

    def files(self) -> dict[str, str]:
        """alice's private files as they are: name -> sha256 of the content (root reads them)."""
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in self.private.iterdir()
                if p.name.startswith("private-")}


def scene(site: Site, label: str, private_in_project: bool = False) -> Scene:
    base = site.root / label
    proj = base / "proj"
    proj.mkdir(parents=True)
    os.chown(proj, 0, site.alice.group)
    proj.chmod(0o2775)
    cache = proj / "cache"
    cache.mkdir()
    os.chown(cache, site.alice.uid, site.alice.group)
    cache.chmod(0o2775)
    private = proj / "results" if private_in_project else site.alice.home / label
    private.mkdir(mode=0o700)
    os.chown(private, site.alice.uid, site.alice.gid)
    for i in range(PRIVATE):  # older than any shard: first in line for an LRU eviction
        path = private / f"private-{i:02d}.dat"
        path.write_bytes(hashlib.sha256(f"{label} {i}".encode()).digest() * (SIZE // 32))
        os.chown(path, site.alice.uid, site.alice.gid)
        path.chmod(0o600)
        os.utime(path, (1.7e9, 1.7e9))
    go = base / "go"
    return Scene(cache, private, go)


def swap(site: Site, scene: Scene, name: Path | None = None) -> None:
    """bob, as any member may in a group-writable directory that is not sticky: ``name`` (the cache) away, a
    symlink to alice's private directory instead."""
    name = name or scene.cache
    done = site.bob.run(["sh", "-c", f'mv "{name}" "{name}.moved" && ln -s "{scene.private}" "{name}"'],
                        umask=0o022)
    assert done.returncode == 0, done.stderr
    assert name.is_symlink()


def swap_inuse(site: Site, scene: Scene) -> None:
    """bob swaps the in-use directory of the cache's coordination tree (group-writable, as the cache is)."""
    swap(site, scene, scene.cache.parent / f".{scene.cache.name}.sharedfs" / "inuse")


def rename_hers_in(site: Site, scene: Scene) -> None:
    """bob renames the cache away and alice's own ``results/`` (0700, beside it) to the cache's name."""
    cache = scene.cache
    done = site.bob.run(["sh", "-c", f'mv "{cache}" "{cache}.moved" && mv "{scene.private}" "{cache}"'], umask=0o022)
    assert done.returncode == 0, done.stderr
    scene.private = cache


def during_job(site: Site, framework: str, variant: str, run: int, attack: Callable[[Site, Scene], None] = swap,
               label: str = "job") -> tuple[int, str]:
    """alice's job fills the cache, bob swaps it, the job evicts: (alice's private files lost, job's stderr)."""
    where = scene(site, f"{framework}-{variant}-{label}-{run}", private_in_project=attack is rename_hers_in)
    kept = where.files()
    proc = site.alice.popen([sys.executable, "-c", JOB, framework, str(where.cache), site.urls(3), str(LIMIT),
                             str(where.go)], env=site.env(variant), umask=0o022)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if line != "ready":
            proc.kill()
            raise AssertionError(f"the job did not get ready ({line!r}): {proc.communicate(timeout=60)[1][-3000:]}")
        attack(site, where)
        where.go.touch()
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0 and out.split() == ["done"], err[-3000:]
    now = where.files()
    return sum(1 for name, digest in kept.items() if now.get(name) != digest), err


def after_swap(site: Site, framework: str, variant: str, run: int) -> tuple[int, str]:
    """bob swaps the cache first; then a new cleanup process of alice's runs: (her private files lost, stderr)."""
    where = scene(site, f"{framework}-{variant}-fresh-{run}")
    kept = where.files()
    swap(site, where)
    proc = site.alice.run([sys.executable, "-c", CLEANUP, framework, str(where.cache), str(LIMIT)],
                          env=site.env(variant), umask=0o022, timeout=180)
    assert proc.returncode == 0 and proc.stdout.split() == ["done"], proc.stderr[-3000:]
    now = where.files()
    return sum(1 for name, digest in kept.items() if now.get(name) != digest), proc.stderr


@pytest.mark.parametrize("framework", ["webdataset", "wids"])
@pytest.mark.parametrize("when", ["during the job", "by a process started after the swap"])
def test_eviction_through_a_swapped_cache_deleted_private_files_and_no_longer_does(site, framework, when) -> None:
    attack = during_job if when == "during the job" else after_swap
    lost: dict[str, list[int]] = {}
    said: list[str] = []
    for variant in VARIANTS:
        lost[variant] = []
        for run in range(RUNS):
            count, err = attack(site, framework, variant, run)
            lost[variant].append(count)
            if variant == "fixed":
                said.append(err)
    print(f"{framework}, cache swapped for a symlink, eviction {when}: alice's private files deleted per run "
          f"(of {PRIVATE}): {json.dumps(lost)}")
    # The attack works without sharedfs and with sharedfs as it was: LRU eviction takes her oldest files.
    assert all(count > 0 for count in lost["stock"]), lost
    assert all(count > 0 for count in lost["before"]), lost
    # Fixed: nothing of hers is touched, and the job says why it skipped eviction, once.
    assert lost["fixed"] == [0] * RUNS, lost
    for err in said:
        lines = [line for line in err.splitlines() if "eviction skipped, nothing deleted" in line]
        assert len(lines) == 1, err[-3000:]
        why = "symlink" if when == "during the job" else site.bob.name
        assert why in lines[0] and str(site.root) in lines[0], lines[0]


@pytest.mark.parametrize("framework", ["webdataset", "wids"])
def test_a_swapped_inuse_directory_of_the_coordination_tree_no_longer_empties_a_private_directory(
        site, framework) -> None:
    """The tree beside a team cache is group-writable: bob swaps its ``inuse/`` for a symlink during alice's job.

    The evictor's sweep read every file there as a garbled marker older than ``GARBLED_GRACE`` and
    unlinked it by path: all of alice's private files, with no size limit involved.  Stock keeps no
    such tree (bob's symlink means nothing to it).  Now each part is entered by descriptor, never
    through a symlink, and must be the tree the job holds.
    """
    lost: dict[str, list[int]] = {}
    said: list[str] = []
    for variant in ("before", "fixed"):
        lost[variant] = []
        for run in range(RUNS):
            count, err = during_job(site, framework, variant, run, attack=swap_inuse, label="inuse")
            lost[variant].append(count)
            if variant == "fixed":
                said.append(err)
    print(f"{framework}, the tree's inuse/ swapped for a symlink: alice's private files deleted per run "
          f"(of {PRIVATE}): {json.dumps(lost)}")
    assert all(count > 0 for count in lost["before"]), lost
    assert lost["fixed"] == [0] * RUNS, lost
    for err in said:
        lines = [line for line in err.splitlines() if "no shard is evicted while it is so" in line]
        assert len(lines) == 1 and "inuse" in lines[0], err[-3000:]


@pytest.mark.parametrize("framework", ["webdataset", "wids"])
def test_her_own_directory_renamed_to_the_caches_name_is_not_evicted_from(site, framework) -> None:
    """No symlink at all: bob renames alice's ``results/`` (hers, 0700, beside the cache) to the cache's name.

    The name leads to a real directory of the right owner, so only the identity the job holds (device
    and inode of the cache it used) tells it from the cache: the layout cached per path must not
    vouch for whatever is at that name now.
    """
    lost: dict[str, list[int]] = {}
    said: list[str] = []
    for variant in VARIANTS:
        lost[variant] = []
        for run in range(RUNS):
            count, err = during_job(site, framework, variant, run, attack=rename_hers_in, label="renamed")
            lost[variant].append(count)
            if variant == "fixed":
                said.append(err)
    print(f"{framework}, her own directory renamed to the cache's name: alice's files deleted per run "
          f"(of {PRIVATE}): {json.dumps(lost)}")
    assert all(count > 0 for count in lost["stock"]), lost
    assert all(count > 0 for count in lost["before"]), lost
    assert lost["fixed"] == [0] * RUNS, lost
    for err in said:
        lines = [line for line in err.splitlines() if "eviction skipped, nothing deleted" in line]
        assert len(lines) == 1 and "is another directory" in lines[0], err[-3000:]

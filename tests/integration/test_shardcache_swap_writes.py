"""A member swaps a shard cache, or its tree's ``inuse/``, for a symlink: nothing may be written there any more.

The set-up of :mod:`test_shardcache_swap` (its users, scene and swaps, imported): alice's job reads
shards through real webdataset (``FileCache``) or real wids (``ShardListDataset``); bob, a member of
the project group, swaps a directory for a symlink to alice's private ``0700`` directory; then the job
reads a shard it has not read yet.  Eviction there went by descriptor already; the fetch path did not:

* **The cache swapped**: the new shard was renamed to its path, so it landed in alice's private
  directory (sharedfs as it was, :data:`BEFORE`).  Now it is renamed into the cache directory's own
  descriptor, proven to be the directory the job used: the download is refused with one line and
  nothing is written there.
* **The tree's** ``inuse/`` **swapped**: the reader's in-use marker was created, then removed, by path
  in alice's private directory.  Now markers are made and removed through the descriptor of the tree's
  own ``inuse/``: none is written (said once), and the shard is read.

"Touched" is any change to alice's directory: a name added or removed, a file's content, or the
directory's modification time (a marker created and removed again leaves only that).  Each
variant runs :data:`RUNS` times in fresh directories.
"""

from __future__ import annotations

import hashlib
import json
import sys
import textwrap
from collections.abc import Callable, Iterator

import pytest
from helpers.shardcache_support import group_of_users, scratch, sharedfs_at
from test_shardcache_swap import Scene, Site, scene, swap, swap_inuse

from sharedfs.demo.shardserver import ShardServer, make_shards

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("test_shardcache_swap_writes")]

#: sharedfs before this change: eviction by descriptor (1a1680b), but shards, markers and claims written by path.
BEFORE = "ed2185e2fd999c406fcacbc3f53447ab2c75b146"
RUNS = 3
SHARDS = 3

# alice's job: read every shard of argv[3] but the last through the framework's cache at argv[2], say
# "ready", wait for the file argv[4], then read the last one (a download); "done", or "refused" and why.
JOB = textwrap.dedent("""
    import os, sys, time
    framework, cache, urls, go = sys.argv[1], sys.argv[2], sys.argv[3].split(","), sys.argv[4]
    if framework == "webdataset":
        import webdataset.cache as wcache
        fc = wcache.FileCache(cache_dir=cache, cache_size=1 << 40)
        read = fc.get_file
    else:
        import wids
        ds = wids.ShardListDataset([{"url": u, "nsamples": 5} for u in urls], cache_dir=cache)
        read = lambda url: ds[5 * urls.index(url)]["__key__"]
    for url in urls[:-1]:
        read(url)
    print("ready", flush=True)
    deadline = time.monotonic() + 120
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        read(urls[-1])
    except Exception as exc:
        print("refused", type(exc).__name__, flush=True)
        print(exc, file=sys.stderr)
    else:
        print("done", flush=True)
""")


def state(where: Scene) -> tuple[dict[str, str], int]:
    """alice's directory as it is: every name with its content's sha256, and the directory's mtime (root reads it)."""
    files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
             for p in where.private.iterdir()}
    return files, where.private.stat().st_mtime_ns


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    with scratch("sharedfs-swapw-") as root, group_of_users(2, root) as (alice, bob):
        make_shards(root / "src", count=SHARDS, samples=5)
        for path in (root / "src", *(root / "src").iterdir()):
            path.chmod(0o755 if path.is_dir() else 0o644)
        before = sharedfs_at(BEFORE, root / "before")
        with ShardServer(root / "src", max_seconds=1800) as shards:
            yield Site(root, alice, bob, shards, before)


def run_job(site: Site, framework: str, variant: str, run: int, attack: Callable[[Site, Scene], None],
            label: str) -> tuple[bool, list[str], str, str]:
    """alice's job, bob's swap, the next read: (her directory touched, names added, job's last word, stderr)."""
    where = scene(site, f"{framework}-{variant}-{label}-{run}")
    kept = state(where)
    proc = site.alice.popen([sys.executable, "-c", JOB, framework, str(where.cache), site.urls(SHARDS),
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
    assert proc.returncode == 0 and out.split()[:1] in (["done"], ["refused"]), err[-3000:]
    now = state(where)
    return now != kept, sorted(set(now[0]) - set(kept[0])), out.split()[0], err


@pytest.mark.parametrize("framework", ["webdataset", "wids"])
def test_a_shard_downloaded_into_a_swapped_cache_landed_in_a_private_directory_and_no_longer_does(
        site, framework) -> None:
    touched: dict[str, list[int]] = {}
    said: list[tuple[str, str]] = []
    for variant in ("before", "fixed"):
        touched[variant] = []
        for run in range(RUNS):
            changed, added, word, err = run_job(site, framework, variant, run, swap, "cache")
            touched[variant].append(int(changed))
            if variant == "before":
                assert any(name.startswith("shard-") for name in added), added  # the shard itself, in her directory
            else:
                said.append((word, err))
    print(f"{framework}, cache swapped for a symlink, then a download: alice's private directory written into per "
          f"run: {json.dumps(touched)}")
    assert all(touched["before"]), touched
    assert touched["fixed"] == [0] * RUNS, touched
    for word, err in said:  # refused, in one line that names the cache and the swap
        lines = [line for line in err.splitlines() if "not downloaded, nothing written" in line]
        assert word == "refused" and len(lines) == 1, err[-3000:]
        assert "symlink" in lines[0] and str(site.root) in lines[0], lines[0]


@pytest.mark.parametrize("framework", ["webdataset", "wids"])
def test_an_inuse_marker_written_through_a_swapped_inuse_directory_no_longer_is(site, framework) -> None:
    touched: dict[str, list[int]] = {}
    said: list[tuple[str, str]] = []
    for variant in ("before", "fixed"):
        touched[variant] = []
        for run in range(RUNS):
            changed, _, word, err = run_job(site, framework, variant, run, swap_inuse, "inuse")
            touched[variant].append(int(changed))
            if variant == "fixed":
                said.append((word, err))
    print(f"{framework}, the tree's inuse/ swapped for a symlink, then a read: alice's private directory written "
          f"into per run: {json.dumps(touched)}")
    assert all(touched["before"]), touched
    assert touched["fixed"] == [0] * RUNS, touched
    for word, err in said:  # the shard is read; that no marker was written is said once
        lines = [line for line in err.splitlines() if "in-use markers not written" in line]
        assert word == "done" and len(lines) == 1 and "inuse" in lines[0], err[-3000:]


"""Invisible until needed: sharedfs's coordination files never show up in the framework's own cache directory.

webdataset's ``LRUCleanup`` and wids' ``keep_most_recent_files`` list and size the
cache directory themselves.  sharedfs before this change
(:data:`shardcache_support.BEFORE`) kept its locks, claims and markers in
``<cache>/.sharedfs/``, so upstream's own tests failed with sharedfs installed,
and it left one lock file per shard ever cached.  The coordination tree now
lives beside the cache (``.<cache>.sharedfs``), with a bounded set of lock
stripes; where no sibling can be had it falls back into the cache and says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.skips import skip_or_fail
from helpers import clean_env, require
from helpers.shardcache_support import User, group_of_users, scratch, sharedfs_at, sharedfs_before

from sharedfs.demo.shardserver import ShardServer, make_shards

require("webdataset", "needs webdataset==1.0.2 (scripts/requirements-test.txt)")
require("wids", "needs wids==0.1.11 (scripts/requirements-test.txt)")
require("torch", "needs torch==2.13.0: wids imports torch.distributed")

# xdist_group: the module's throwaway users, made once.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("test_shardcache_layout")]

# Upstream's own tests, verbatim but for imports and comments: webdataset tests/test_cache.py::test_lru_cleanup,
# and wids tests/test_wids_cleanup.py::test_keep_most_recent_files (github.com/webdataset/webdataset, where
# wids lived under tests/wids/ until it moved to its own repository).
UPSTREAM = textwrap.dedent('''
    import os, tempfile, time
    from webdataset.cache import LRUCleanup
    from wids.wids_cleanup import keep_most_recent_files


    def test_lru_cleanup(tmp_path):
        lru_cleanup = LRUCleanup(tmp_path, interval=None)
        for i in range(20):
            fname = os.path.join(tmp_path, "%06d" % i)
            with open(fname, "wb") as f:
                f.write(b"x" * 4096)
            time.sleep(0.1)
        assert "000000" in os.listdir(tmp_path)
        assert "000019" in os.listdir(tmp_path)
        total_before = sum(os.path.getsize(os.path.join(tmp_path, fname)) for fname in os.listdir(tmp_path))
        lru_cleanup.cache_size = total_before * 0.5
        lru_cleanup.cleanup()
        total_after = sum(os.path.getsize(os.path.join(tmp_path, fname)) for fname in os.listdir(tmp_path))
        assert total_after <= total_before * 0.5
        assert "000000" not in os.listdir(tmp_path)
        assert "000019" in os.listdir(tmp_path)


    def test_keep_most_recent_files():
        nfiles = 50
        size = 73
        nremain = 17
        cutoff = size * nremain + 1
        with tempfile.TemporaryDirectory() as tmpdir:
            for i in range(nfiles):
                with open(os.path.join(tmpdir, f"file{i:03d}"), "wb") as f:
                    f.write(b"x" * size)
                    time.sleep(0.01)
            keep_most_recent_files(tmpdir + "/*", maxsize=cutoff, debug=True)
            remaining_files = sorted(os.listdir(tmpdir))
            assert len(remaining_files) == nremain
            expected_files = [f"file{i:03d}" for i in range(nfiles - nremain, nfiles)]
            assert sorted(remaining_files) == expected_files
''')


def _upstream(tmp_path: Path, label: str, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run upstream's tests with ``env``; a sticky, world-writable TMPDIR stands for /tmp."""
    work = tmp_path / label
    tmpdir = work / "tmp"
    tmpdir.mkdir(parents=True)
    tmpdir.chmod(0o1777)
    (work / "test_upstream.py").write_text(UPSTREAM)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp",
                           str(work / "basetemp"), str(work / "test_upstream.py")], check=False, cwd=work,
                          capture_output=True, text=True, timeout=300, env=clean_env({"TMPDIR": str(tmpdir), "COLUMNS": "400", **env}))  # untruncated summary lines
    return proc, tmpdir


def test_upstream_cleanup_tests_pass_with_sharedfs(tmp_path: Path) -> None:
    plain, _ = _upstream(tmp_path, "plain", {"SHAREDFS_DISABLE": "1"})
    assert plain.returncode == 0, plain.stdout
    before, _ = _upstream(tmp_path, "before", sharedfs_before(tmp_path / "sharedfs-before"))
    failed = [line for line in before.stdout.splitlines() if line.startswith("FAILED")]
    print("\n".join(failed))
    assert any("test_keep_most_recent_files" in line and "assert 18 == 17" in line for line in failed), before.stdout
    assert any("test_lru_cleanup" in line and "assert 45056 <= (81920 * 0.5)" in line for line in failed), before.stdout
    fixed, tmpdir = _upstream(tmp_path, "fixed", {"SHAREDFS_STRICT": "1"})
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    # TemporaryDirectory removed the cache; its sibling went with the process, not left in "/tmp" for good.
    assert [p.name for p in tmpdir.iterdir() if p.name.endswith(".sharedfs")] == []


# Many shards through a cache that holds two: each download evicts an older shard.
CHURN = textwrap.dedent("""
    import json, os, sys
    import sharedfs.shardcache as shardcache
    if os.environ.get("T_STRIPES"):
        shardcache.treenames.STRIPES = int(os.environ["T_STRIPES"])  # a small bound, to see it hold with a few shards
    import webdataset.cache as cache
    urls, size = json.loads(sys.argv[2]), int(sys.argv[3])
    fc = cache.FileCache(cache_dir=sys.argv[1], cache_size=size, cache_cleanup_interval=0)
    for url in urls:
        fc.get_file(url)
""")


def _census(directory: Path) -> dict[str, int]:
    return {p.name: len(list(p.iterdir())) for p in sorted(directory.iterdir()) if p.is_dir()}


def test_no_lock_file_or_claim_outlives_its_shard(tmp_path: Path) -> None:
    shards = make_shards(tmp_path / "src", count=60, samples=1, size=512)
    assert shards
    size = (tmp_path / "src" / "shard-000000.tar").stat().st_size
    with ShardServer(tmp_path / "src") as server:
        urls = json.dumps(server.urls(server.shard_names()))
        runs = {}
        for label, env in (("before", sharedfs_before(tmp_path / "sharedfs-before")),
                           ("fixed", {"SHAREDFS_STRICT": "1", "T_STRIPES": "8"})):
            cache = tmp_path / label / "cache"
            proc = subprocess.run([sys.executable, "-c", CHURN, str(cache), urls, str(2 * size + 1)], check=False,
                                  env=clean_env(env), capture_output=True, text=True, timeout=300)
            assert proc.returncode == 0, proc.stderr
            runs[label] = cache
    before = runs["before"] / ".sharedfs"
    print("before:", _census(before), "in the cache:", sorted(p.name for p in runs["before"].iterdir())[:3], "...")
    assert _census(before)["locks"] == 60  # one lock file per shard ever cached, 58 of them evicted
    fixed, cache = tmp_path / "fixed" / ".cache.sharedfs", runs["fixed"]
    kept = sorted(p.name for p in cache.iterdir())
    print("fixed:", _census(fixed), "in the cache:", kept)
    # webdataset evicts before each download: two shards within the budget plus the newest, and nothing else.
    assert kept == ["shard-000057.tar", "shard-000058.tar", "shard-000059.tar"]
    census = _census(fixed)
    assert census["stripes"] <= 8 and census["claims"] == 3 and census["inuse"] == 0 and census["tmp"] == 0


# One shard cache, opened by webdataset and cleaned by wids, in one process: what the log says.
USE = textwrap.dedent("""
    import os, sys
    from webdataset.cache import LRUCleanup
    from wids.wids_cleanup import keep_most_recent_files
    for _ in range(2):
        keep_most_recent_files(os.path.join(sys.argv[1], "*"), maxsize=1)
        LRUCleanup(sys.argv[1], 1, interval=None).cleanup()
""")


@pytest.fixture(scope="module")
def users() -> Iterator[tuple[Path, User, User]]:
    with scratch() as root, group_of_users(2, root) as (first, second):
        yield root, first, second


def _shared_cache(base: Path, owner: User, parent_mode: int) -> Path:
    """``<base>/<parent>/cache``: the parent owned by root, the cache by ``owner`` and the group, 2775."""
    parent = base / "parent"
    parent.mkdir(parents=True)
    parent.chmod(parent_mode)
    cache = parent / "cache"
    cache.mkdir()
    os.chown(cache, owner.uid, owner.group)
    cache.chmod(0o2775)
    return cache


def test_without_a_writable_parent_everyone_falls_back_inside_the_cache_and_says_so(users) -> None:
    root, first, second = users
    cache = _shared_cache(root / "readonly-parent", first, 0o755)  # nobody but root may write the parent
    subprocess.run(["setfacl", "-m", f"u:{second.name}:rwx", str(cache.parent)], check=True)  # ... but the second
    one = first.python(USE, str(cache), env={"SHAREDFS_STRICT": "1"})
    assert one.returncode == 0, one.stderr
    sibling = cache.parent / ".cache.sharedfs"
    said = [line for line in one.stderr.splitlines() if "coordination files go to" in line]
    assert len(said) == 1 and f"{cache}/.sharedfs" in said[0] and "Permission denied" in said[0], one.stderr
    assert (cache / ".sharedfs" / "stripes").is_dir() and not sibling.exists()
    # The second user could make the sibling, but must coordinate with the first: it follows the tree that exists.
    two = second.python(USE, str(cache), env={"SHAREDFS_STRICT": "1"})
    assert two.returncode == 0, two.stderr
    assert not sibling.exists() and "exists there already" in two.stderr


def test_a_sibling_squatted_in_a_world_writable_parent_is_not_trusted(users) -> None:
    root, owner, squatter = users
    cache = _shared_cache(root / "sticky-parent", owner, 0o1777)  # /tmp-like: anyone may create entries
    sibling = cache.parent / ".cache.sharedfs"
    made = squatter.python(f"import os; os.mkdir({str(sibling)!r}, 0o777)")
    assert made.returncode == 0, made.stderr
    proc = owner.python(USE, str(cache), env={"SHAREDFS_STRICT": "1"})
    assert proc.returncode == 0, proc.stderr
    assert f"is owned by uid {squatter.uid}, not by the cache's owner (uid {owner.uid})" in proc.stderr
    assert (cache / ".sharedfs" / "stripes").is_dir() and list(sibling.iterdir()) == []


def test_a_cache_that_is_a_mount_point_keeps_its_tree_inside(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    bound = subprocess.run(["mount", "--bind", str(cache), str(cache)], check=False, capture_output=True, text=True)
    if bound.returncode != 0:
        skip_or_fail(f"cannot bind-mount (needs root): {bound.stderr.strip()}")
    try:
        proc = subprocess.run([sys.executable, "-c", USE, str(cache)], check=False, capture_output=True, text=True,
                              timeout=300, env=clean_env({"SHAREDFS_STRICT": "1"}))
    finally:
        subprocess.run(["umount", "-l", str(cache)], check=False)
    assert proc.returncode == 0, proc.stderr
    assert f"{cache} is a mount point" in proc.stderr
    assert not (tmp_path / ".cache.sharedfs").exists()


# A user's reader: every shard once, through webdataset's cache.
READ_ALL = textwrap.dedent("""
    import json, sys
    import webdataset.cache as cache
    fc = cache.FileCache(cache_dir=sys.argv[1])
    for url in json.loads(sys.argv[2]):
        fc.get_file(url)
""")


def test_removing_the_cache_but_not_its_hidden_sibling_costs_nothing(tmp_path: Path) -> None:
    import shutil
    import time

    make_shards(tmp_path / "src", count=8, samples=1, size=512)
    cache = tmp_path / "cache"
    with ShardServer(tmp_path / "src") as server:
        urls = json.dumps(server.urls(server.shard_names()))
        timings = []
        for _ in range(2):  # the second run right after `rm -r cache`, which leaves .cache.sharedfs behind
            server.reset()
            started = time.monotonic()
            proc = subprocess.run([sys.executable, "-c", READ_ALL, str(cache), urls], check=False, capture_output=True,
                                  text=True, timeout=300, env=clean_env({"SHAREDFS_STRICT": "1"}))
            timings.append(time.monotonic() - started)
            assert proc.returncode == 0, proc.stderr
            assert server.counts() == {name: 1 for name in server.shard_names()}
            shutil.rmtree(cache)
    print(f"first run {timings[0]:.1f} s, after rm -r {timings[1]:.1f} s")
    # The claims still say "published"; they were published on this node, where lagging metadata
    # cannot hide a shard, so nobody waits LAG_BOUND (60 s) for shards that are gone.
    assert timings[1] < timings[0] + 10


# -- sharedfs locks finds the tree beside the cache --------------------------------------------------

#: A webdataset/wids reader of a shard, as the shard cache marks it, until told to leave.
READER = """
import sys
from sharedfs.shardcache.claims import InUse
with InUse(sys.argv[1]):
    print("reading", flush=True)
    sys.stdin.read()
"""


def _reader_rows(cache: Path, env: dict[str, str]) -> list[dict]:
    reader = subprocess.Popen([sys.executable, "-c", READER, str(cache / "shard-00000.tar")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=clean_env({"SHAREDFS_NODE_ID": "nodeA"}))
    try:
        assert reader.stdout is not None and reader.stdout.readline().strip() == "reading"
        done = subprocess.run([sys.executable, "-m", "sharedfs", "locks", "--json", str(cache)], capture_output=True,
                              text=True, timeout=60, cwd="/", env=clean_env({"SHAREDFS_NODE_ID": "nodeA", **env}))
        assert done.returncode in (0, 1), done.stderr
        return [row for row in json.loads(done.stdout) if row["kind"] == "shard-reader"]
    finally:
        reader.communicate("", timeout=30)


def test_the_readers_of_a_cache_with_a_long_name_are_listed(tmp_path: Path) -> None:
    # A cache name of 245 characters: its tree's name is cut short to fit NAME_MAX.  The walk looked for
    # the uncut name, found nothing, and listed no reader.
    cache = tmp_path / ("c" * 245)
    cache.mkdir()
    before = sharedfs_at("ed5fb26", tmp_path / "before")
    assert _reader_rows(cache, before) == []
    found = _reader_rows(cache, {})
    assert len(found) == 1 and found[0]["state"] == "held", found

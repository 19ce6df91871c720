"""webdataset on shared storage, as users run it: real webdataset 1.0, real HTTP shards, real processes.

Each test first shows what plain webdataset does (``SHAREDFS_DISABLE=1``):
duplicate downloads across nodes, a killed download's partial left behind,
eviction deleting files other readers need, 16 workers on 2 CPUs -- and then
that with sharedfs (autoloaded by its ``.pth``, nothing changed in the user
code) every shard is fetched once per cache, nothing partial is ever visible,
no reader loses a file, and the worker count fits the CPUs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import clean_env, require

from sharedfs.demo.nodes import assert_all_ok, run_on_nodes
from sharedfs.demo.shardserver import ShardServer, make_shards, wait_until

require("webdataset", "needs webdataset==1.0.2 (scripts/requirements-test.txt)")
require("torch", "needs torch==2.13.0 (scripts/requirements-test.txt)")

pytestmark = pytest.mark.slow
TESTS = str(Path(__file__).resolve().parents[1])
SAMPLES = 20

# What a user's training script does: read every shard through webdataset's cache.
READER = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, os.environ["T_TESTS"])
    from sharedfs.demo.shardserver import sample_digest, start_together
    import webdataset as wds
    from torch.utils.data import DataLoader
    urls = json.loads(os.environ["T_URLS"])
    ds = wds.WebDataset(urls, cache_dir=os.environ["T_CACHE"], shardshuffle=False, empty_check=False)
    loader = DataLoader(ds, num_workers=int(os.environ["T_WORKERS"]), batch_size=None)
    start_together(os.environ["T_GATE"])  # both nodes hit the server at once, as ranks of one job do
    got = {s["__key__"]: sample_digest(s["__key__"], s["bin"]) for s in loader}
    print(json.dumps({"samples": got, "num_workers": loader.num_workers}))
""")


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("shards")
    return root, make_shards(root, count=8, samples=SAMPLES)


def _env(**extra: object) -> dict[str, str]:
    env = clean_env({"T_TESTS": TESTS, "SHAREDFS_STRICT": "1"})
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _visible(cache: Path) -> list[str]:
    """What a user (or webdataset) sees in the cache directory: all of it (sharedfs keeps nothing there)."""
    return sorted(p.name for p in cache.iterdir())


def _coordination(cache: Path) -> Path:
    """Where sharedfs keeps the cache's locks, claims, markers and partial downloads: beside it."""
    return cache.parent / f".{cache.name}.sharedfs"


def test_two_nodes_fetch_each_shard_once_per_cache_with_sharedfs(hostile_mount, shards, tmp_path) -> None:
    # lagging+localflock: a new file reaches the other node late (NFS attribute and lookup caches)
    # and flock excludes only within a node (GPFS, Lustre localflock) -- a shared cache on either.
    profile = "lagging+localflock"
    root, expected = shards
    mount = hostile_mount(profile, lag_ms=1500)
    with ShardServer(root, delay=0.3) as server:
        urls = json.dumps(server.urls(server.shard_names()))
        runs, failed = {}, {}
        for label, extra in (("plain", {"SHAREDFS_DISABLE": "1"}), ("sharedfs", {})):
            (mount.backing / label).mkdir()  # seeded in the backing dir: every node sees it at once
            server.reset()
            env = _env(T_URLS=urls, T_CACHE=mount.path / label, T_WORKERS=4, SHAREDFS_MAX_WORKERS="off",
                       T_GATE=tmp_path / f"gate-{label}", **extra)
            results = run_on_nodes([sys.executable, "-c", READER], {"nodeA": 1, "nodeB": 1}, env=env, timeout=120)
            runs[label] = server.counts()
            failed[label] = [r.stderr.strip().splitlines()[-1] for r in results if r.returncode != 0]
            if label == "sharedfs":
                assert_all_ok(results)
            for r in results:  # 2 nodes x 4 DataLoader workers: every sample intact on both nodes
                if r.returncode == 0:
                    out = json.loads(r.stdout)
                    assert out["num_workers"] == 4 and out["samples"] == expected
    # Plain webdataset: no lock, so both nodes fetch; on lagging storage the second rename even
    # hides the first node's file from it (FileNotFoundError on the shard).
    duplicates = sum(runs["plain"].values()) - len(runs["plain"])
    assert duplicates > 0 or failed["plain"], (runs["plain"], failed["plain"])
    print(f"plain webdataset on {profile}: {duplicates} duplicate fetches, failures: {failed['plain']}")
    # sharedfs: the physical limit, one fetch per shard for the whole (shared) cache.
    assert runs["sharedfs"] == {name: 1 for name in server.shard_names()}
    assert _visible(mount.backing / "sharedfs") == server.shard_names()  # the test is no node: ask the backing


GET = textwrap.dedent("""
    import os, sys
    import webdataset.cache as cache
    print(cache.FileCache(cache_dir=sys.argv[1]).get_file(sys.argv[2]), flush=True)
""")


def test_killed_download_leaves_no_visible_partial(hostile_mount, shards) -> None:
    root, _ = shards
    mount = hostile_mount("plain")
    name = "shard-000003.tar"
    with ShardServer(root, stall={name}) as server:
        leftovers = {}
        for label, extra in (("plain", {"SHAREDFS_DISABLE": "1"}), ("sharedfs", {})):
            cache = mount.path / label
            cache.mkdir()
            server.reset()
            env = _env(**extra)
            # Its own session, so that the kill takes curl (webdataset's downloader) along.
            proc = subprocess.Popen([sys.executable, "-c", GET, str(cache), server.url(name)], env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
            try:
                wait_until(lambda c=cache, p=proc: p.poll() is not None
                           or (server.counts().get(name) == 1 and _partial_written(c)), timeout=60)
                assert proc.poll() is None, f"{label} reader exited early:\n{proc.stderr.read().decode()}"
                assert _partial_written(cache), f"{label}: download never started"
            finally:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            leftovers[label] = _visible(cache)
        # The next reader (sharedfs on) fetches the shard cleanly; the dead download is cleaned up.
        server.stall.clear()
        done = subprocess.run([sys.executable, "-c", GET, str(mount.path / "sharedfs"), server.url(name)], check=False,
                              env=_env(), capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    assert leftovers["plain"] and all(".temp" in n for n in leftovers["plain"]), leftovers  # a partial, forever
    assert leftovers["sharedfs"] == []
    published = mount.path / "sharedfs" / name
    assert published.read_bytes() == (root / name).read_bytes()
    assert list((_coordination(mount.path / "sharedfs") / "tmp").iterdir()) == []


def _partial_written(cache: Path) -> bool:
    # The temp file exists once the response started (webdataset reads in 1 MiB chunks, so
    # with the server stalled half-way it may hold no bytes yet: still a partial shard).
    return bool([*cache.glob("*.temp*"), *(_coordination(cache) / "tmp").glob("*/*")])


# Readers that go through webdataset's FileCache with a cache smaller than one shard, so
# LRU eviction runs before every download while the other readers download and read.
EVICT = textwrap.dedent("""
    import io, json, os, random, sys, tarfile
    sys.path.insert(0, os.environ["T_TESTS"])
    from sharedfs.demo.shardserver import sample_digest
    import webdataset.cache as cache
    urls = json.loads(os.environ["T_URLS"])
    expected = json.loads(os.environ["T_EXPECTED"])
    fc = cache.FileCache(cache_dir=os.environ["T_CACHE"], cache_size=int(os.environ["T_SIZE"]),
                         cache_cleanup_interval=0)
    rng = random.Random(int(os.environ["SHAREDFS_TEST_INDEX"]))
    order = urls * 2
    rng.shuffle(order)
    for url in order:
        for item in fc([url]):
            data = item["stream"].read()
            item["stream"].close()
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                members = [m for m in tar.getmembers() if m.name.endswith(".bin")]
                assert len(members) == NSAMPLES, f"truncated shard {url}: {len(members)} samples"
                for m in members:
                    key = m.name[:-4]
                    assert sample_digest(key, tar.extractfile(m).read()) == expected[key], key
    print("ok")
""").replace("NSAMPLES", str(SAMPLES))


def test_eviction_never_takes_a_file_from_a_reader(tmp_path, shards) -> None:
    root, expected = shards
    shard_size = (root / "shard-000000.tar").stat().st_size
    with ShardServer(root, delay=0.05, midway=0.05) as server:  # downloads in flight for a while
        outcomes = {}
        for label, extra in (("plain", {"SHAREDFS_DISABLE": "1"}), ("sharedfs", {})):
            cache = tmp_path / label
            cache.mkdir()
            env = _env(T_URLS=json.dumps(server.urls(server.shard_names())), T_EXPECTED=json.dumps(expected),
                       T_CACHE=cache, T_SIZE=shard_size // 2, **extra)
            outcomes[label] = run_on_nodes([sys.executable, "-c", EVICT], {"node": 3}, env=env, timeout=120)
    failures = [r.stderr.strip().splitlines()[-1] for r in outcomes["plain"] if r.returncode != 0]
    print("plain webdataset readers failed with:", failures)
    assert failures, "plain webdataset's LRUCleanup should have deleted a file another reader needed"
    assert all(("FileNotFoundError" in f or "truncated" in f or "Error" in f) for f in failures), failures
    assert_all_ok(outcomes["sharedfs"])


CAP = textwrap.dedent("""
    import json, os, sys
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0], sorted(os.sched_getaffinity(0))[-1]})
    import webdataset as wds
    from torch.utils.data import DataLoader, get_worker_info
    shards = json.loads(os.environ["T_SHARDS"])
    ds = wds.WebDataset(shards, shardshuffle=False, empty_check=False).map(lambda s: get_worker_info().id)
    loader = DataLoader(ds, num_workers=16, batch_size=None)
    workers = sorted(set(loader))
    other = DataLoader(list(range(4)), num_workers=16)  # not a webdataset dataset: never capped
    print(json.dumps({"num_workers": loader.num_workers, "used": workers, "other": other.num_workers}))
""")


@pytest.mark.parametrize(("extra", "expected"), [
    ({"SHAREDFS_DISABLE": "1"}, 16),  # without sharedfs: 16 processes on 2 CPUs
    ({}, 2),
    ({"SHAREDFS_MAX_WORKERS": "off"}, 16),
    ({"SHAREDFS_MAX_WORKERS": "3"}, 3),
])
def test_worker_cap_fits_the_cpus_of_the_task(shards, extra: dict, expected: int) -> None:
    root, _ = shards
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs at least 2 CPUs to limit the affinity to 2")
    env = _env(T_SHARDS=json.dumps([str(p) for p in sorted(root.glob("*.tar"))]), **extra)
    proc = subprocess.run([sys.executable, "-c", CAP], check=False, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["num_workers"] == expected and out["other"] == 16
    assert len(out["used"]) == min(expected, 8)  # 8 shards: at most 8 workers get one
    log = [line for line in proc.stderr.splitlines() if line.startswith("sharedfs: DataLoader")]
    if expected == 2:
        assert len(log) == 1 and "num_workers=16 asked, 2 used" in log[0] and "CPU affinity" in log[0], log
    elif expected == 3:
        assert len(log) == 1 and "SHAREDFS_MAX_WORKERS=3" in log[0], log
    else:
        assert log == []


def test_shim_is_reversible_and_version_gated() -> None:
    code = textwrap.dedent("""
        import json, webdataset, webdataset.cache as cache
        from torch.utils.data import DataLoader
        import sharedfs
        from sharedfs.startup import activation
        state = activation.shim_states()["webdataset"]
        patched = (cache.FileCache.__module__, cache.FileCache.__name__, state.supported,
                   DataLoader.__init__.__name__, hasattr(DataLoader.__init__, "__wrapped__"))
        sharedfs.disable()
        restored = (cache.FileCache.__qualname__, cache.download.__doc__.startswith("Download"),
                    hasattr(DataLoader.__init__, "__wrapped__"), webdataset.LRUCleanup is cache.LRUCleanup)
        print(json.dumps([patched, restored, state.installed_version]))
    """)
    proc = subprocess.run([sys.executable, "-c", code], check=False, env=_env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    patched, restored, version = json.loads(proc.stdout)
    assert patched == ["webdataset.cache", "SharedFSFileCache", True, "__init__", True]
    assert restored == ["FileCache", True, False, True]
    assert version.startswith(("0.2.", "1.0."))


PLACE = textwrap.dedent("""
    import json, sys
    import webdataset.cache as cache
    print(json.dumps([cache.FileCache().cache_dir, cache.FileCache(cache_dir=sys.argv[1]).cache_dir]))
""")


def test_node_local_policy_places_the_default_cache_and_user_dirs_win(tmp_path) -> None:
    mine = str(tmp_path / "mine")
    runs = {label: subprocess.run([sys.executable, "-c", PLACE, mine], check=False, capture_output=True, text=True,
                                  timeout=120, env=_env(SHAREDFS_CACHE="node-local", SHAREDFS_CACHE_ROOT=tmp_path,
                                                        SHAREDFS_LOG="info", **extra))
            for label, extra in (("plain", {"SHAREDFS_DISABLE": "1"}), ("sharedfs", {}))}
    for proc in runs.values():
        assert proc.returncode == 0, proc.stderr
    # Plain webdataset: a cache relative to wherever the job happens to start (often shared $HOME).
    assert json.loads(runs["plain"].stdout) == ["./_cache", mine]
    placed = tmp_path / f"sharedfs-{os.getuid()}" / "nojob" / "webdataset"
    assert json.loads(runs["sharedfs"].stdout) == [str(placed), mine]
    assert f"webdataset cache -> {placed}" in runs["sharedfs"].stderr
    assert f"webdataset cache stays at {mine}: cache_dir=" in runs["sharedfs"].stderr

"""The frameworks' caches on real client mounts two nodes apart: one download per cache.

JuiceFS, MooseFS and GlusterFS with 3 s client caches (the ``lagging`` profile), each node's
processes reaching the volume through that node's own client mount.

torch.hub: 4 ranks on 2 nodes call ``torch.hub.load_state_dict_from_url`` for one checkpoint.
Stock torch downloads it on every rank that looks before the first copy lands, and a rank may
open the copy another node just renamed over (``FileNotFoundError`` on JuiceFS, ``ESTALE`` on
GlusterFS).  sharedfs before
the handover rule (``BEFORE``, run from a worktree) takes a lock around torch's check-then-download,
yet the first holder on the second node still finds the checkpoint "missing" (its node cached the
miss of torch's own look before the lock) and downloads it again, or, on MooseFS, a rank raises
``FileExistsError``: its lock-file open met the client's EEXIST (fixed in c12e0c2), or its makedirs
guard gave up on ``checkpoints`` (fixed in 46e7616).  Now the next holder on another
node waits out the mount's cache timeout before ``acquire()`` returns (docs/api.md, "What the next
holder sees"): one download.

webdataset: a reader on each node reads every shard through one ``cache_dir`` on the volume.
Stock webdataset takes no lock: both nodes fetch each shard.  With sharedfs each shard is
fetched once for the whole cache, and the coordination tree is the cache's hidden sibling on
both nodes: on JuiceFS (whose mount root every user may write) sharedfs before c8a8ae5 took the
sibling node a had just made, seen late on node b, for a squatted one and put a second tree
inside the cache on node b (2 of 2 runs).

wids: 2 readers per node.  Stock wids' ``ULockFile`` unlinks its lock file on release
(webdataset#386); through a lagging client the next open or flock of that name meets the
removed inode (``FileNotFoundError``).  With sharedfs every reader finishes and each shard is
fetched once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers import clean_env, require
from helpers.torchhub import BEFORE, RANKS, SlowServer, checkpoint_server, download_on_ranks, expected_loads, worktree

from sharedfs.demo import node_env
from sharedfs.demo.realfs import LAG_S, Volume
from sharedfs.demo.shardserver import ShardServer, make_shards

require("torch", "needs torch==2.13.0 (scripts/requirements-test.txt)")
require("webdataset", "needs webdataset==1.0.2 (scripts/requirements-test.txt)")
require("wids", "needs wids==0.1.11 (scripts/requirements-test.txt)")

# xdist_group: one real volume at a time; MooseFS volumes of two workers at once disagreed with runs alone.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("realfs")]

TESTS = str(Path(__file__).resolve().parents[1])
SAMPLES = 20


@pytest.fixture
def server() -> Iterator[SlowServer]:
    with checkpoint_server() as srv:
        yield srv


def on_each_node(vol: Volume, label: str) -> list[Path]:
    """``label`` made through node a's mount, once every node's client sees it: one path per node."""
    (vol.mounts[0] / label).mkdir()
    time.sleep(LAG_S + 0.5)
    return [mount / label for mount in vol.mounts]


def test_torch_hub_ranks_on_two_nodes_download_a_checkpoint_once(
        real_volume: Callable[..., Volume], server: SlowServer, tmp_path: Path) -> None:
    vol = real_volume("lagging")
    stock, stock_loads = download_on_ranks(on_each_node(vol, "stock"), tmp_path / "sync-stock", server, None,
                                           env={**os.environ, "SHAREDFS_DISABLE": "1"}, may_fail=True)
    crashed = [got["error"] for got in stock_loads if "error" in got]
    # The old code's second download needs the second node's first holder to look within the lag after the
    # first node's publish; on a loaded machine its ranks can come later (one fresh-clone CI run saw 1
    # download on MooseFS), so up to three tries show it.
    with worktree(BEFORE, tmp_path / "before") as old_code:
        for attempt in range(3):
            old, old_loads = download_on_ranks(on_each_node(vol, f"before-{attempt}"),
                                               tmp_path / f"sync-before-{attempt}", server, old_code, may_fail=True)
            old_crashed = [got["error"] for got in old_loads if "error" in got]
            if old >= 2 or any("FileExistsError" in err for err in old_crashed):
                break
    now, now_loads = download_on_ranks(on_each_node(vol, "now"), tmp_path / "sync-now", server, None)
    print(f"{vol.kind}: {RANKS} ranks on 2 nodes, lagging {LAG_S:.0f} s: stock {stock} downloads "
          f"(crashed: {crashed}), sharedfs {BEFORE} {old} (crashed: {old_crashed}), now {now}")
    # Stock: every rank that looks before the first copy lands downloads; a rank may also open the checkpoint
    # another node's download just renamed over (FileNotFoundError on JuiceFS, ESTALE on GlusterFS).
    assert stock >= 2
    # The old code downloads again on the second node; on MooseFS a rank may also raise FileExistsError
    # (the lock file's plain create, or 'checkpoints': lookups answered from the client's negative cache).
    assert old >= 2 or any("FileExistsError" in err for err in old_crashed), \
        "the second node's first holder should have found the checkpoint missing"
    assert now == 1
    assert [got for got in stock_loads if "error" not in got] == expected_loads()[:RANKS - len(crashed)]
    assert [got for got in old_loads if "error" not in got] == expected_loads()[:RANKS - len(old_crashed)]
    assert now_loads == expected_loads()


# A user's training script: every shard through webdataset's cache (as in test_webdataset.py).
READER = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, os.environ["T_TESTS"])
    from sharedfs.demo.shardserver import sample_digest, start_together
    import webdataset as wds
    from torch.utils.data import DataLoader
    urls = json.loads(os.environ["T_URLS"])
    ds = wds.WebDataset(urls, cache_dir=os.environ["T_CACHE"], shardshuffle=False, empty_check=False)
    loader = DataLoader(ds, num_workers=int(os.environ["T_WORKERS"]), batch_size=None)
    start_together(os.environ["T_GATE"])
    got = {s["__key__"]: sample_digest(s["__key__"], s["bin"]) for s in loader}
    print(json.dumps({"samples": got, "num_workers": loader.num_workers}))
""")


def read_on_nodes(program: str, caches: list[Path], env: dict[str, str],
                  per_node: int = 1) -> list[subprocess.CompletedProcess[str]]:
    """``per_node`` readers on each node, each through its node's path to the cache; their results."""
    count = per_node * len(caches)
    procs = [subprocess.Popen([sys.executable, "-c", program], text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL,
                              env=node_env("ab"[i % 2], {**env, "T_CACHE": str(caches[i % 2])}, SHAREDFS_TEST_INDEX=i,
                                           SHAREDFS_TEST_COUNT=count))
             for i in range(count)]
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=300)
            results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


def test_webdataset_two_nodes_fetch_each_shard_once_per_cache(
        real_volume: Callable[..., Volume], tmp_path: Path) -> None:
    vol = real_volume("lagging")
    root = tmp_path / "shards"
    root.mkdir()
    expected = make_shards(root, count=8, samples=SAMPLES)
    runs, failed = {}, {}
    with ShardServer(root, delay=0.3) as server:
        names = server.shard_names()
        for label, extra in (("stock", {"SHAREDFS_DISABLE": "1"}), ("sharedfs", {})):
            caches = on_each_node(vol, label)
            server.reset()
            env = clean_env({"T_TESTS": TESTS, "SHAREDFS_STRICT": "1", "T_URLS": json.dumps(server.urls(names)),
                             "T_WORKERS": "4", "SHAREDFS_MAX_WORKERS": "off", "T_GATE": str(tmp_path / f"gate-{label}"),
                             **extra})
            results = read_on_nodes(READER, caches, env)
            runs[label] = server.counts()
            failed[label] = [r.stderr.strip().splitlines()[-1] for r in results if r.returncode != 0]
            if label == "sharedfs":
                assert not failed[label], [r.stderr[-3000:] for r in results]
            for r in results:  # 2 nodes x 4 DataLoader workers: every sample intact on both nodes
                if r.returncode == 0:
                    out = json.loads(r.stdout.strip().splitlines()[-1])
                    assert out["num_workers"] == 4 and out["samples"] == expected
    duplicates = sum(runs["stock"].values()) - len(runs["stock"])
    print(f"{vol.kind}: webdataset on 2 nodes, lagging {LAG_S:.0f} s: stock {duplicates} duplicate fetches of "
          f"{len(names)} shards (failures: {failed['stock']}), sharedfs {sum(runs['sharedfs'].values())} fetches")
    assert duplicates > 0 or failed["stock"], (runs["stock"], failed["stock"])
    assert runs["sharedfs"] == {name: 1 for name in names}
    time.sleep(LAG_S + 0.5)  # this process's view through node a settles
    assert sorted(p.name for p in (vol.mounts[0] / "sharedfs").iterdir()) == names  # nothing else in the cache


# A user's reader of a wids ShardListDataset (as in test_wids.py): every sample, in the order of its rank.
WIDS_READER = textwrap.dedent("""
    import json, os, random, sys
    sys.path.insert(0, os.environ["T_TESTS"])
    from sharedfs.demo.shardserver import sample_digest, start_together
    import wids
    urls = json.loads(os.environ["T_URLS"])
    ds = wids.ShardListDataset([{"url": u, "nsamples": NSAMPLES} for u in urls], cache_dir=os.environ["T_CACHE"],
                               transformations=[])
    order = list(range(len(ds)))
    random.Random(int(os.environ["SHAREDFS_TEST_INDEX"])).shuffle(order)
    start_together(os.environ["T_GATE"])
    got = {}
    for i in order:
        s = ds[i]
        data = s[".bin"]
        got[s["__key__"]] = sample_digest(s["__key__"], data.read() if hasattr(data, "read") else bytes(data))
    print(json.dumps(got))
""").replace("NSAMPLES", str(SAMPLES))


# Only JuiceFS: stock wids failed there in 4 of 4 runs.  MooseFS: 1 of 4 readers failed (FileExistsError
# opening the lock file) in 3 of 4 runs, too seldom for a test; GlusterFS: no failure, no second fetch in
# 3 of 3 runs (each holder's only look for a shard is under a flock that excludes across clients).
@pytest.mark.parametrize("realfs_kind", ["juicefs"], indirect=True)
def test_wids_two_nodes_fetch_each_shard_once_per_cache(real_volume: Callable[..., Volume], tmp_path: Path) -> None:
    vol = real_volume("lagging")
    root = tmp_path / "shards"
    root.mkdir()
    expected = make_shards(root, count=8, samples=SAMPLES)
    runs, failed = {}, {}
    with ShardServer(root, delay=0.3) as server:
        names = server.shard_names()
        for label, extra in (("stock", {"SHAREDFS_DISABLE": "1"}), ("sharedfs", {})):
            caches = on_each_node(vol, label)
            server.reset()
            env = clean_env({"T_TESTS": TESTS, "SHAREDFS_STRICT": "1", "T_URLS": json.dumps(server.urls(names)),
                             "T_GATE": str(tmp_path / f"gate-{label}"), **extra})
            results = read_on_nodes(WIDS_READER, caches, env, per_node=2)
            runs[label] = server.counts()
            failed[label] = [r.stderr.strip().splitlines()[-1] for r in results if r.returncode != 0]
            if label == "sharedfs":
                assert not failed[label], [r.stderr[-3000:] for r in results]
            assert all(json.loads(r.stdout.strip().splitlines()[-1]) == expected for r in results if r.returncode == 0)
    duplicates = sum(runs["stock"].values()) - len(runs["stock"])
    print(f"{vol.kind}: wids on 2 nodes x 2 readers, lagging {LAG_S:.0f} s: stock {duplicates} duplicate fetches "
          f"of {len(names)} shards (failures: {failed['stock']}), sharedfs {sum(runs['sharedfs'].values())} fetches")
    # Stock: ULockFile unlinks its lock file on release (webdataset#386); through a lagging client the next
    # open or flock of that name can meet the removed inode (FileNotFoundError), or a holder finds a shard
    # another node published "missing" and fetches it again.
    assert duplicates > 0 or failed["stock"], (runs["stock"], failed["stock"])
    assert runs["sharedfs"] == {name: 1 for name in names}

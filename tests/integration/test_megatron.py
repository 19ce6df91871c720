"""User stories of the megatron shim: megatron-core's GPT dataset index cache, built by gloo ranks on CPU.

Each rank (``tests/helpers/mgworker.py``) runs ``BlendedMegatronDatasetBuilder(GPTDataset, ...)`` over a
tiny indexed dataset made with megatron's own ``IndexedDatasetBuilder``: global rank 0 builds
``<md5>-GPTDataset-train-{description.txt,document_index.npy,sample_index.npy,shuffle_index.npy}`` in
``path_to_cache``, the builder's barrier follows, and the other ranks load them.  Stock is
``SHAREDFS_DISABLE=megatron``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest
from harness.skips import skip_or_fail
from helpers import HELPERS, clean_env

from sharedfs.demo.nodes import node_env
from sharedfs.demo.ports import free_port

try:  # never imported here: megatron.core warns at import (no Transformer Engine), and warnings fail tests
    metadata.version("megatron-core")
except metadata.PackageNotFoundError as exc:
    skip_or_fail(f"the megatron shim's tests need megatron-core (scripts/requirements-test.txt): {exc}",
                 module_level=True)

pytestmark = pytest.mark.slow

WORKER = str(HELPERS / "mgworker.py")
STOCK = {"SHAREDFS_DISABLE": "megatron"}
UPSTREAM, SHIM = "megatron.core.datasets.gpt_dataset", "sharedfs.shims.megatron"
#: Samples of the killed job: a shuffle index of 6 MB, long enough to be caught half-written.
MANY = 1_500_000


@pytest.fixture(scope="module")
def prefix(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny indexed dataset every job reads (on local disk: only the index cache is on the mount)."""
    path = str(tmp_path_factory.mktemp("megatron-data") / "tiny")
    subprocess.run([sys.executable, WORKER, "prepare", path], check=True, env=clean_env(), cwd="/", timeout=120)
    return path


def start_job(cache: str, prefix: str, samples: int, nodes: list[str], extra: dict[str, str],
              local_root: Path | None = None) -> list[subprocess.Popen[str]]:
    """One job: rank i on simulated node ``nodes[i]``, all in one gloo group."""
    port = free_port()
    ranks = []
    for rank, node in enumerate(nodes):
        env = node_env(node, clean_env(extra), local_root=local_root, RANK=rank, WORLD_SIZE=len(nodes),
                       LOCAL_RANK=nodes[:rank].count(node), LOCAL_WORLD_SIZE=nodes.count(node),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        ranks.append(subprocess.Popen([sys.executable, WORKER, "rank", cache, prefix, str(samples)], env=env,
                                      cwd="/", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return ranks


def finish(ranks: list[subprocess.Popen[str]], timeout: float = 300) -> list[dict]:
    """Every rank's JSON line; a rank that printed none (killed by gloo after a peer failed) is a failure."""
    outcomes = []
    try:
        for index, rank in enumerate(ranks):
            out, err = rank.communicate(timeout=timeout)
            lines = [line for line in out.splitlines() if line.startswith("{")]
            outcomes.append(json.loads(lines[-1]) if lines else {"rank": index, "ok": False, "error": err[-500:]})
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
                rank.wait()
    return outcomes


def run_job(*args: object, **kwargs: object) -> list[dict]:
    return finish(start_job(*args, **kwargs))  # type: ignore[arg-type]


def failures(outcomes: list[dict]) -> list[str]:
    return [f"rank {o['rank']}: {o['error']}" for o in outcomes if not o["ok"]]


def kill_while_writing_shuffle_index(cache: Path, prefix: str) -> Path:
    """Rank 0 of a stock job, SIGKILLed while ``numpy.save`` writes its shuffle index; returns the short file."""
    (job,) = start_job(str(cache), prefix, MANY, ["a"], STOCK)
    deadline = time.monotonic() + 120
    try:
        while True:
            found = list(cache.glob("*-shuffle_index.npy")) if cache.is_dir() else []
            if found and found[0].stat().st_size > 128:  # past numpy's header: the data is being written
                job.send_signal(signal.SIGKILL)
                break
            assert job.poll() is None, job.communicate()
            assert time.monotonic() < deadline, "the job never wrote its shuffle index"
            time.sleep(0.0005)
    finally:
        job.kill()
        job.communicate()
    return found[0]


@pytest.mark.long
def test_a_shuffle_index_cut_short_by_a_killed_job_fails_every_rerun_stock_and_is_rebuilt_with_sharedfs(
        hostile_mount, prefix: str) -> None:
    """A rank 0 killed mid-``numpy.save`` leaves a short ``.npy`` at its final name,
    which megatron's ``os.path.isfile`` check accepts: every rerun dies in ``numpy.load(mmap_mode='r')``."""
    mount = hostile_mount("plain").path
    cache = mount / "cache"
    short = kill_while_writing_shuffle_index(cache, prefix)
    size = short.stat().st_size
    assert 128 < size < MANY * 4, size  # the header and part of the data: 4-byte entries (uint32)

    for _ in range(2):  # every rerun, not only the first
        stock = run_job(str(cache), prefix, MANY, ["a", "a"], STOCK)
        assert {o.get("build") for o in stock if o.get("build")} == {UPSTREAM}
        assert not any(o["ok"] for o in stock), stock
        assert "ValueError: mmap length is greater than file size" in stock[0]["error"], stock
        assert short.stat().st_size == size

    for _ in range(2):  # the rerun that rebuilds, then one that loads what it published
        with_ = run_job(str(cache), prefix, MANY, ["a", "a"], {})
        assert {o["build"] for o in with_} == {SHIM}
        assert failures(with_) == []
    assert short.stat().st_size > size
    assert [p.name for p in cache.iterdir() if p.name.startswith(".")] == []  # no private build directory left
    print(f"killed writer: shuffle index {size} of {short.stat().st_size} bytes; 2 of 2 reruns fail stock, 0 of 2 with sharedfs")


@pytest.mark.long
def test_a_lagging_filesystem_hides_rank_0s_index_from_other_nodes_stock_never_with_sharedfs(
        hostile_mount, prefix: str) -> None:
    """9 ranks on 3 nodes, new entries invisible to other nodes for 3 s: megatron checks each file once after
    the barrier, and the ranks on nodes b and c fail (Megatron-LM#35, #1355, gpt-neox#919)."""
    mount = hostile_mount("lagging", lag_ms=3000).path
    nodes = ["a"] * 3 + ["b"] * 3 + ["c"] * 3

    stock = run_job(str(mount / "stock"), prefix, 2000, nodes, STOCK)
    failed = failures(stock)
    assert len(failed) == 6 and all("FileNotFoundError" in f and "GPTDataset-train-" in f for f in failed), failed
    assert all(o["ok"] for o in stock if o["node"] == "a"), stock

    with_ = run_job(str(mount / "sharedfs"), prefix, 2000, nodes, {})
    assert {o["build"] for o in with_} == {SHIM}
    assert failures(with_) == []
    print(f"lagging 3 s, 9 ranks on 3 nodes: {len(failed)} fail stock, 0 with sharedfs")


def test_a_node_local_path_to_cache_in_a_multi_node_job_is_explained(tmp_path: Path, prefix: str) -> None:
    """``path_to_cache`` on each node's own disk (the same path, another disk per node): rank 0 builds on node a,
    and the rank on node b gets a bare FileNotFoundError stock (Megatron-LM#907), an error naming path_to_cache
    with sharedfs."""
    cache = "$SHAREDFS_CACHE_ROOT/megatron-cache"
    nodes = ["a", "b"]

    stock = run_job(cache, prefix, 2000, nodes, STOCK, local_root=tmp_path / "stock")
    assert stock[0]["ok"] and stock[1]["error"].startswith("FileNotFoundError: [Errno 2]"), stock

    with_ = run_job(cache, prefix, 2000, nodes, {}, local_root=tmp_path / "sharedfs")
    assert with_[0]["ok"], with_
    error = with_[1]["error"]
    assert error.startswith("NodeLocalIndexCacheError: megatron's dataset index file "), error
    assert "node-local storage" in error and "set path_to_cache" in error and "incomplete on this node (b)" in error
    assert not os.path.exists(tmp_path / "sharedfs" / "b" / "megatron-cache")

"""User stories of the modelscope shim: ``modelscope_hub``'s own download path on cluster filesystems.

Each process is a ModelScope user (``tests/helpers/msworker.py``) downloading into one hub cache on a
hostilefs mount, from simulated nodes; only the network fetch is replaced, inside the worker, so the
lock is taken by modelscope_hub's ``download_file`` with its real arguments (``<cache>/.lock/file_<sha256>.lock``
around the fetch).  Stock is ``SHAREDFS_DISABLE=modelscope``: the hub's own ``_optional_file_lock``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import HELPERS, clean_env, make_venv, require

from sharedfs.demo.nodes import NodeResult, node_env, run_on_nodes

require("modelscope_hub", "the modelscope shim's tests need modelscope-hub (scripts/requirements-test.txt)")

pytestmark = pytest.mark.slow

WORKER = str(HELPERS / "msworker.py")
STOCK = {"SHAREDFS_DISABLE": "modelscope"}
UPSTREAM, SHIM = "modelscope_hub._download", "sharedfs.shims.modelscope"
#: The hub with the last filelock that raises "use SoftFileLock instead" on ENOSYS (3.24.0 falls back itself).
OLD_FILELOCK = ("modelscope-hub==0.5.1", "filelock==3.23.0")


def outcome(result: NodeResult) -> dict:
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert lines, f"node {result.node}: {result.stderr[-3000:]}"
    return json.loads(lines[-1])


def download_on_nodes(cache: Path, nodes: dict[str, int], extra: dict[str, str], *args: str,
                      timeout: float = 120, python: str = sys.executable) -> list[dict]:
    results = run_on_nodes([python, WORKER, str(cache), *args], nodes, env=clean_env(extra),
                           timeout=timeout, cwd="/")
    return [outcome(result) for result in results]


def overlaps(log: Path) -> int:
    """How many pairs of fetches ran at the same time (each held the download lock)."""
    spans = sorted((entry["began"], entry["ended"]) for entry in map(json.loads, log.read_text().splitlines()))
    return sum(1 for i, (_, end) in enumerate(spans) for began, _ in spans[i + 1:] if began < end)


def test_nfs_without_lockd_fails_every_download_stock_and_none_with_sharedfs(hostile_mount) -> None:
    """ENOLCK: the hub falls back to a soft lock only on ESTALE/ENOENT/EREMOTEIO, so all 12 users fail."""
    mount = hostile_mount("nfs-nolock").path
    nodes = {"a": 4, "b": 4, "c": 4}

    stock = download_on_nodes(mount / "stock", nodes, STOCK)
    assert {entry["lock"] for entry in stock} == {UPSTREAM}  # SHAREDFS_DISABLE=modelscope: the hub's own lock
    failed = [entry["error"] for entry in stock if not entry["ok"]]
    assert len(failed) == 12 and all("[Errno 37] No locks available" in error for error in failed), failed

    with_ = download_on_nodes(mount / "sharedfs", nodes, {})
    assert {entry["lock"] for entry in with_} == {SHIM}
    assert [entry["error"] for entry in with_ if not entry["ok"]] == []


def test_node_local_flock_lets_two_nodes_download_at_once_stock_never_with_sharedfs(
        hostile_mount, tmp_path: Path) -> None:
    """GPFS / Lustre localflock: flock excludes one node only.  With sharedfs no two fetches overlap, also
    with lease locks whose holders hold past the lease (a live holder renews it and is never broken)."""
    mount = hostile_mount("localflock").path
    nodes = {"a": 2, "b": 2, "c": 2}

    stock_log = tmp_path / "stock.log"
    stock = download_on_nodes(mount / "stock", nodes, STOCK, "--times", "2", "--hold", "0.4", "--log", str(stock_log))
    # Two nodes in one download at once; a process may even lose the file another one is replacing.
    stock_failed = [entry["error"] for entry in stock if not entry["ok"]]
    assert all(error.startswith("FileNotFoundError") for error in stock_failed), stock_failed
    stock_overlaps = overlaps(stock_log)
    assert stock_overlaps > 0, "stock flock excluded across nodes: the fault did not show"

    for name, extra, hold in (("auto", {}, "0.4"),
                              ("lease", {"SHAREDFS_LOCK": "lease", "SHAREDFS_LEASE_SECONDS": "1"}, "1.5")):
        log = tmp_path / f"{name}.log"
        with_ = download_on_nodes(mount / name, nodes, extra, "--times", "2" if name == "auto" else "1",
                                  "--hold", hold, "--log", str(log), timeout=180)
        assert [entry["error"] for entry in with_ if not entry["ok"]] == [], name
        assert overlaps(log) == 0, (name, log.read_text())
    print(f"localflock: {stock_overlaps} overlapping fetches and {len(stock_failed)} failed downloads stock, "
          "0 and 0 with sharedfs")


def _kill_holder(cache: Path, ready: Path, extra: dict[str, str]) -> int:
    """A download on node a that is SIGKILLed while its fetch runs (it holds the lock); returns its pid."""
    holder = subprocess.Popen([sys.executable, WORKER, str(cache), "--hold", "300", "--ready", str(ready)],
                              env=node_env("a", clean_env(extra)), cwd="/", stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert holder.poll() is None, holder.stderr.read() if holder.stderr else ""
            assert time.monotonic() < deadline, "the holder never started its download"
            time.sleep(0.05)
    finally:
        holder.kill()
        holder.wait()
    return holder.pid


def held_by(cache: Path) -> int:
    """The pid in the holder record of the cache's one download lock."""
    (marker,) = (cache / ".lock").glob("*.lock.held")
    return json.loads(marker.read_text())["pid"]


def test_lustre_noflock_a_killed_holder_blocks_every_waiter_stock_and_is_taken_over_with_sharedfs(
        hostile_mount, tmp_path: Path) -> None:
    """Lustre without ``-o flock``: filelock falls back to a soft lock, which a SIGKILLed download leaves behind.
    Stock, the waiters on nodes b and c reach the hub's lock deadline (4 s here, 600 s by default) and fail;
    with sharedfs a waiter on the holder's node sees its pid gone, and with lease locks waiters on other
    nodes take it over once the lease ran out."""
    mount = hostile_mount("lustre-noflock").path
    deadline = {"MODELSCOPE_DOWNLOAD_FILE_LOCK_TIMEOUT_SECONDS": "4"}

    _kill_holder(mount / "stock", tmp_path / "stock.ready", STOCK)
    stock = download_on_nodes(mount / "stock", {"b": 1, "c": 1}, {**STOCK, **deadline})
    assert [entry["ok"] for entry in stock] == [False, False]
    assert all(entry["error"].startswith("_DownloadDeadlineError") and "Download file lock timed out after 4.0s"
               in entry["error"] for entry in stock), stock

    # sharedfs, its default kind there (soft): the holder's node knows its pid is gone.
    victim = _kill_holder(mount / "auto", tmp_path / "auto.ready", {})
    assert held_by(mount / "auto") == victim  # its lock is still there, naming the dead holder
    patient = {"MODELSCOPE_DOWNLOAD_FILE_LOCK_TIMEOUT_SECONDS": "60"}
    auto = download_on_nodes(mount / "auto", {"a": 1, "b": 1, "c": 1}, patient)
    assert [entry["error"] for entry in auto if not entry["ok"]] == []

    # sharedfs with lease locks: nodes b and c alone take the lock over within the lease.
    lease = {"SHAREDFS_LOCK": "lease", "SHAREDFS_LEASE_SECONDS": "2", **patient}
    victim = _kill_holder(mount / "lease", tmp_path / "lease.ready", lease)
    assert held_by(mount / "lease") == victim
    started = time.monotonic()
    taken = download_on_nodes(mount / "lease", {"b": 1, "c": 1}, lease)
    assert [entry["error"] for entry in taken if not entry["ok"]] == []
    took = time.monotonic() - started
    assert took < 30
    print(f"lustre-noflock, killed holder: 2 of 2 waiters fail stock; taken over with lease locks in {took:.1f} s")


def test_lustre_noflock_with_filelock_3_23_every_download_waits_out_the_deadline_stock_and_none_with_sharedfs(
        hostile_mount, tmp_path: Path, sharedfs_wheel: Path) -> None:
    """filelock < 3.24 raises "use SoftFileLock instead" on ENOSYS; the hub falls back to a ``SoftFileLock`` on the
    file its failed flock just created, so even the first download on an empty cache waits for itself until the
    hub's lock deadline.  After ``pip install sharedfs`` in the same venv every download works."""
    venv = make_venv(tmp_path / "venv", *OLD_FILELOCK)
    mount = hostile_mount("lustre-noflock").path
    nodes = {"a": 1, "b": 1, "c": 1}
    deadline = {"MODELSCOPE_DOWNLOAD_FILE_LOCK_TIMEOUT_SECONDS": "3"}

    stock = download_on_nodes(mount / "stock", nodes, deadline, python=venv.python)
    assert {entry["lock"] for entry in stock} == {UPSTREAM}  # no sharedfs in this venv yet
    assert all(not entry["ok"] and entry["error"].startswith("_DownloadDeadlineError") for entry in stock), stock

    venv.pip("install", str(sharedfs_wheel))
    with_ = download_on_nodes(mount / "sharedfs", nodes, deadline, python=venv.python)
    assert {entry["lock"] for entry in with_} == {SHIM}
    assert [entry["error"] for entry in with_ if not entry["ok"]] == []

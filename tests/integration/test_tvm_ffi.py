"""User stories of the tvm_ffi shim: ``tvm_ffi.cpp.load_inline`` with its JIT build cache on cluster filesystems.

Each process (``tests/helpers/tvmworker.py``) JIT-builds one tiny C++ function with real apache-tvm-ffi, g++ and
ninja, HOME on a hostilefs mount, 2 processes on each of 3 simulated nodes.  ``$CXX`` is a wrapper that logs
each compile with its directory, so the builds per cache directory are counted.  Stock is ``SHAREDFS_DISABLE=tvm_ffi``
(tvm-ffi's own lock and default cache) or, where the standard library's ``mkdir`` is the failure,
``SHAREDFS_DISABLE=1``.  With sharedfs the home default is placed per node (``~/.cache/tvm-ffi/<node>``) and a
``TVM_FFI_CACHE_DIR`` the user set on the shared mount is kept: both are run.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path

import pytest
from helpers import HELPERS, clean_env, require

from sharedfs.demo.nodes import NodeProcess, NodeResult, NodesTimeout, run_on_nodes

require("tvm_ffi", "the tvm_ffi shim's tests need apache-tvm-ffi (scripts/requirements-test.txt)")

pytestmark = pytest.mark.slow

WORKER = str(HELPERS / "tvmworker.py")
NODES = {"a": 2, "b": 2, "c": 2}
UPSTREAM, SHIM = "tvm_ffi.utils.lockfile.FileLock", "sharedfs.shims.tvm_ffi.FileLock"
#: A stock process still waiting after this long counts as hung (a build here takes 2-15 s).
HUNG_AFTER = 45.0

CXX = """#!/bin/sh
case " $* " in *" -c "*) echo "$PWD" >> {log} ;; esac
exec c++ "$@"
"""


def _outcome(result: NodeResult) -> dict:
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if lines:
        return json.loads(lines[-1])
    return {"ok": False, "hung": result.returncode == -9, "error": result.stderr[-2000:] or None}


def _env(extra: dict[str, str]) -> dict[str, str]:
    """clean_env without the runner's own TVM_FFI_CACHE_DIR: sharedfs in this pytest worker may have placed
    one (another test's node-local policy), and tvm-ffi would then build there, off the mount under test."""
    env = clean_env()
    env.pop("TVM_FFI_CACHE_DIR", None)
    return {**env, **extra}


def build_on_nodes(home: Path, tmp_path: Path, tag: str, extra: dict[str, str], *, sync: bool = False,
                   timeout: float = 300, nodes: dict[str, int] = NODES,
                   python: str = sys.executable) -> tuple[list[dict], Counter[str]]:
    """Every process's outcome (``hung``: killed after ``timeout``) and the compiles per build directory's cache
    (``python``: see helpers.nodemounts)."""
    log = tmp_path / f"{tag}.compiles"
    cxx = tmp_path / f"{tag}.cxx"
    cxx.write_text(CXX.format(log=log))
    cxx.chmod(0o755)
    args = [python, WORKER]
    if sync:
        (tmp_path / f"{tag}.sync").mkdir()
        args += ["--sync", str(tmp_path / f"{tag}.sync")]
    env = _env({"HOME": str(home), "CXX": str(cxx), **extra})
    try:
        results = run_on_nodes(args, nodes, env=env, timeout=timeout, cwd="/")
    except NodesTimeout as exc:
        results = exc.results
    compiles = Counter(os.path.dirname(line) for line in log.read_text().splitlines()) if log.exists() else Counter()
    return [_outcome(result) for result in results], compiles


def _home(mount) -> Path:
    (mount.backing / "home").mkdir()  # seeded in the backing directory: every node sees it at once
    return mount.path / "home"


def _failed(outcomes: list[dict]) -> list[str]:
    return [str(entry["error"]) for entry in outcomes if not entry["ok"] and not entry.get("hung")]


def _hung(outcomes: list[dict]) -> int:
    return sum(1 for entry in outcomes if entry.get("hung"))


def _fixed(outcomes: list[dict], compiles: Counter[str], caches: set[str]) -> None:
    """0 failures, 0 hangs, sharedfs's lock, and exactly one build in each of ``caches``."""
    assert _failed(outcomes) == [] and _hung(outcomes) == 0, outcomes
    assert {entry["lock"] for entry in outcomes} == {SHIM}, outcomes
    assert {entry["cache"] for entry in outcomes} == caches, outcomes
    assert set(compiles) == caches and set(compiles.values()) == {1}, compiles


def test_nfs_without_lockd_hangs_every_build_stock_and_none_with_sharedfs(hostile_mount, tmp_path: Path) -> None:
    """ENOLCK: tvm-ffi's FileLock takes it for "someone holds it" and retries every 0.1 s forever.  Stock
    (``SHAREDFS_DISABLE=tvm_ffi``), all 6 processes still wait after 45 s without a compile; with sharedfs each
    node's cache is built once (the placed default), and a shared ``TVM_FFI_CACHE_DIR`` the user set once."""
    mount = hostile_mount("nfs-nolock")
    home = _home(mount)

    stock, compiles = build_on_nodes(home, tmp_path, "stock", {"SHAREDFS_DISABLE": "tvm_ffi"}, timeout=HUNG_AFTER)
    assert _hung(stock) == 6 and not compiles, (stock, compiles)
    (build_dir,) = (mount.backing / "home/.cache/tvm-ffi").iterdir()  # the default, not placed: the shim is off
    assert (build_dir / "lock").exists()  # they got as far as tvm-ffi's lock, and waited there

    placed, compiles = build_on_nodes(home, tmp_path, "placed", {})
    _fixed(placed, compiles, {f"{home}/.cache/tvm-ffi/{node}" for node in NODES})

    team = str(mount.path / "team-tvm-ffi")
    shared, compiles = build_on_nodes(home, tmp_path, "shared", {"TVM_FFI_CACHE_DIR": team})
    _fixed(shared, compiles, {team})
    print(f"nfs-nolock: stock {_hung(stock)} of 6 hung; with sharedfs 0 hung, 0 failed, one build per cache")


def test_node_local_flock_lets_nodes_build_into_one_directory_stock_never_with_sharedfs(
        hostile_mount, tmp_path: Path) -> None:
    """GPFS / Lustre localflock: tvm-ffi's flock excludes one node's processes only, so the nodes compile and
    link into one build directory at once (``file too short``, a module that fails to load); with sharedfs one
    build per cache."""
    mount = hostile_mount("localflock")
    home = _home(mount)

    stock, compiles = build_on_nodes(home, tmp_path, "stock", {"SHAREDFS_DISABLE": "tvm_ffi"}, sync=True)
    assert {entry["lock"] for entry in stock if "lock" in entry} == {UPSTREAM}, stock
    assert _hung(stock) == 0
    (cache,) = compiles
    assert compiles[cache] >= 2, ("tvm-ffi's flock excluded across nodes: the fault did not show", compiles)

    placed, placed_compiles = build_on_nodes(home, tmp_path, "placed", {}, sync=True)
    _fixed(placed, placed_compiles, {f"{home}/.cache/tvm-ffi/{node}" for node in NODES})

    team = str(mount.path / "team-tvm-ffi")
    shared, shared_compiles = build_on_nodes(home, tmp_path, "shared", {"TVM_FFI_CACHE_DIR": team}, sync=True)
    _fixed(shared, shared_compiles, {team})
    print(f"localflock: stock {compiles[cache]} builds in one cache, {len(_failed(stock))} of 6 failed "
          f"{[error[-120:] for error in _failed(stock)[:2]]}; with sharedfs 0 failed, one build per cache")


def test_lagging_metadata_fails_the_cache_mkdir_stock_and_never_with_sharedfs(hostile_mount, tmp_path: Path) -> None:
    """A node that cannot see the directory another node just made (3 s): tvm-ffi's
    ``Path.mkdir(parents=True, exist_ok=True)`` raises ``FileExistsError``; with sharedfs the makedirs guard
    (applied with this shim) waits for it, and the lock's handover lets the next node see the build."""
    mount = hostile_mount("lagging", lag_ms=3000)
    home = _home(mount)

    stock, _ = build_on_nodes(home, tmp_path, "stock", {"SHAREDFS_DISABLE": "1"}, sync=True)
    failed = _failed(stock)
    assert failed and all(error.startswith("FileExistsError: [Errno 17] File exists") for error in failed), stock

    placed, compiles = build_on_nodes(home, tmp_path, "placed", {}, sync=True)
    _fixed(placed, compiles, {f"{home}/.cache/tvm-ffi/{node}" for node in NODES})

    team = str(mount.path / "team-tvm-ffi")
    shared, compiles = build_on_nodes(home, tmp_path, "shared", {"TVM_FFI_CACHE_DIR": team}, sync=True)
    _fixed(shared, compiles, {team})
    print(f"lagging: stock {len(failed)} of 6 failed ({failed[0][:80]}); with sharedfs 0 failed, one build per cache")


def _lock_process(node: str, path: Path, disabled: bool) -> NodeProcess:
    process = NodeProcess(node, env=_env({"SHAREDFS_DISABLE": "tvm_ffi"} if disabled else {}))
    process.run(f"from tvm_ffi.cpp import extension; lock = extension.FileLock({str(path)!r})")
    return process


def test_the_build_lock_keeps_tvm_ffis_interface_and_excludes_other_nodes_and_stock_builders(
        hostile_mount) -> None:
    """localflock: a build lock held on node a excludes node b (tvm-ffi's own lock would not) and a builder
    without sharedfs on node a (its flock of the same file); ``acquire()`` tries once and answers False,
    ``blocking_acquire(timeout)`` raises tvm-ffi's ``TimeoutError``, ``release()`` frees it; a second instance in
    the holder's own process is refused, as tvm-ffi's flock refuses it."""
    mount = hostile_mount("localflock")
    build_dir = mount.path / "cache" / "add_one_0"
    (mount.backing / "cache" / "add_one_0").mkdir(parents=True)
    path = build_dir / "lock"
    with _lock_process("a", path, False) as holder, _lock_process("b", path, False) as other, \
            _lock_process("a", path, True) as stock_here, _lock_process("b", path, True) as stock_there:
        assert holder.run("type(lock).__module__ + '.' + type(lock).__qualname__") == SHIM
        assert stock_here.run("type(lock).__module__ + '.' + type(lock).__qualname__") == UPSTREAM
        assert holder.run("lock.acquire()") is True
        assert holder.run("lock.acquire()") is False  # held by this instance: tvm-ffi's answer
        assert holder.run("extension.FileLock(lock.lock_file_path).acquire()") is False  # another instance: refused
        assert other.run("lock.acquire()") is False  # another node: excluded
        assert stock_here.run("lock.acquire()") is False  # tvm-ffi without sharedfs on the holder's node
        assert stock_there.run("lock.acquire()") is True  # what stock flock does across nodes here
        stock_there.run("lock.release()")
        other.run("try:\n    lock.blocking_acquire(timeout=0.5)\nexcept TimeoutError as exc:\n"
                  "    raised = str(exc)\nelse:\n    raised = None")
        raised = other.run("raised")
        assert raised == f"Failed to acquire lock on '{path}' after 0.5 seconds.", raised
        holder.run("lock.release()")
        assert other.run("lock.blocking_acquire(timeout=30)") is True
        assert holder.run("lock.acquire()") is False
        other.run("lock.release()")
        assert holder.run("lock.acquire()") is True  # the lock its release left idle, taken again
        holder.run("second = extension.FileLock(lock.lock_file_path)")
        assert holder.run("second.acquire()") is False
        holder.run("lock.release()")
        assert holder.run("second.acquire()") is True
        holder.run("second.release()")
        assert stock_here.run("lock.acquire()") is True
        stock_here.run("lock.release()")

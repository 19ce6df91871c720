"""A real mmengine 0.10.7 ``Runner`` with ``SharedFSHook``, on a filesystem that shows new entries late.

User story: a classic mmengine config adds ``custom_hooks=[dict(type="SharedFSHook", ...)]``
and the job runs with its work dir on a shared filesystem whose clients see each other's
new directories and files late (hostilefs ``lagging``: NFS attribute / negative-lookup
caches).  Each test first shows what happens without sharedfs, then with it.  Ranks are
separate processes on simulated nodes (``SHAREDFS_NODE_ID``) in a real gloo group.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from helpers import HELPERS, clean_env, require

from sharedfs.demo.nodes import NodeResult, run_on_nodes
from sharedfs.demo.ports import free_port

for _name in ("torch", "mmengine"):
    require(_name, "needs mmengine==0.10.7 and torch (pip install -r scripts/requirements-test.txt)")

TESTS = HELPERS  # the xt_* programs and configs
LAUNCH = str(TESTS / "xt_launch.py")
CONFIG = str(TESTS / "xt_toy_config.py")
#: Long enough that the other node's first look falls inside it; every wait sharedfs does is bounded by it.
LAG_MS = 4000


def _train(work_dir: Path, report: Path, nodes: list[str], env: dict[str, str] | None = None,
           extra: tuple[str, ...] = (), timeout: float = 120) -> list[NodeResult]:
    """Run the toy config with one rank per entry of ``nodes`` (rank i on simulated node nodes[i])."""
    report.mkdir(parents=True, exist_ok=True)
    base = clean_env({"PYTHONPATH": str(TESTS), "XT_REPORT": str(report), "MASTER_ADDR": "127.0.0.1",
                      "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1", **(env or {})})
    return run_on_nodes([sys.executable, LAUNCH, CONFIG, str(work_dir), *extra], nodes, env=base,
                        timeout=timeout, cwd="/")


def _reports(report: Path) -> dict[int, dict[str, Any]]:
    return {int(p.stem[4:]): json.loads(p.read_text()) for p in report.glob("rank*.json")}


def _explain(results: list[NodeResult]) -> str:
    return "\n".join(f"--- rank {r.index} (node {r.node}) exit {r.returncode}\n{r.stderr[-3000:]}" for r in results)


def test_hook_kwargs_override_the_environment_single_process(tmp_path: Path, hostile_mount) -> None:
    """custom_imports + dict(type="SharedFSHook", cache=..., wait_timeout=...) beats SHAREDFS_* for this run."""
    fs = hostile_mount("lagging", lag_ms=LAG_MS)
    mnt, backing = fs.path, fs.backing  # the test reads the backing dir: through the mount it is a third "node"
    env = {"SHAREDFS_CACHE": "shared", "SHAREDFS_WAIT_TIMEOUT": "5"}

    # Without sharedfs the hook still builds (configs need not change to switch sharedfs off) and says so.
    off = _train(mnt / "off", tmp_path / "off", ["a"], {**env, "SHAREDFS_DISABLE": "1"})
    assert off[0].returncode == 0, _explain(off)
    assert "sharedfs is disabled (SHAREDFS_DISABLE=all); SharedFSHook changes nothing" in off[0].stdout + off[0].stderr

    results = _train(mnt / "runs" / "single", tmp_path / "on", ["a"], env)
    assert results[0].returncode == 0, _explain(results)
    seen = _reports(tmp_path / "on")[0]
    assert seen["end_iter"] == 4
    policy = seen["policy"]  # read inside the run, by a hook, after SharedFSHook.__init__
    assert policy["cache"] == {"value": "node-local", "source": "argument cache"}
    assert policy["wait_timeout"] == {"value": 77.0, "source": "argument wait_timeout"}
    assert policy["lock"]["source"] == "default"
    # The resolved policy is logged once, through the runner's logger (its log file too).
    log_files = list((backing / "runs" / "single").glob("*/*.log"))
    assert len(log_files) == 1
    line = "sharedfs policy: lock='auto' (default), cache='node-local' (argument cache)"
    assert log_files[0].read_text().count(line) == 1
    # Checkpoints were published by rename: complete, and no temp files left behind.
    work = backing / "runs" / "single"
    assert (work / "last_checkpoint").read_text().strip().endswith("iter_4.pth")
    assert not [p for p in os.listdir(work) if p.endswith(".tmp")]


def test_two_ranks_on_two_nodes_lagging_work_dir(tmp_path: Path, hostile_mount) -> None:
    """Every rank creates work_dir and the log dir: FileExistsError / missing dir on the lagging fs without sharedfs."""
    fs = hostile_mount("lagging", lag_ms=LAG_MS)
    mnt, backing = fs.path, fs.backing
    env = {"SHAREDFS_WAIT_TIMEOUT": "60"}

    naive = _train(mnt / "naive" / "exp", tmp_path / "naive", ["a", "b"], {**env, "SHAREDFS_DISABLE": "1"})
    assert any(r.returncode != 0 for r in naive)
    # The loser of the race: EEXIST then a stale isdir() (FileExistsError), or the winner's parent
    # directory still invisible when creating the child (FileNotFoundError) -- both in mkdir_or_exist.
    failed = [r.stderr for r in naive if "in mkdir_or_exist" in r.stderr]
    assert failed and any(err in failed[0] for err in ("FileExistsError", "FileNotFoundError")), _explain(naive)

    results = _train(mnt / "fixed" / "exp", tmp_path / "fixed", ["a", "b"], env)
    assert all(r.returncode == 0 for r in results), _explain(results)
    seen = _reports(tmp_path / "fixed")
    assert sorted(seen) == [0, 1]
    for rank, got in seen.items():
        assert got["end_iter"] == 4
        assert got["policy"]["cache"]["value"] == "node-local"  # the hook's kwargs, on every rank
        assert got["policy"]["wait_timeout"] == {"value": 77.0, "source": "argument wait_timeout"}
        assert got["policy"]["node_id"]["value"] == "ab"[rank]
    assert seen[0]["log_dir"] == seen[1]["log_dir"]  # one log dir (rank 0's timestamp), made without error
    assert (backing / "fixed" / "exp" / "iter_4.pth").exists()


def test_resume_on_lagging_fs_every_rank_resumes_from_the_same_complete_checkpoint(
        tmp_path: Path, hostile_mount) -> None:
    """A job resumed right after the previous one: node b cannot see its files yet.

    Without sharedfs the job dies before it can resume (the work dir, the checkpoint and
    last_checkpoint are all still invisible on node b; the new log dir races).  With it, rank 0 picks
    the checkpoint, every rank waits until it can see that complete file, and all resume.
    """
    lag = 12000  # covers the second job's start-up (importing torch twice on 2 cores)
    fs = hostile_mount("lagging", lag_ms=lag)
    mnt, backing = fs.path, fs.backing
    env = {"SHAREDFS_WAIT_TIMEOUT": "60"}

    def first_then_resume(label: str, resume_env: dict[str, str]) -> list[NodeResult]:
        work = mnt / label
        first = _train(work, tmp_path / label / "first", ["a"], env)
        assert first[0].returncode == 0, _explain(first)
        started = time.monotonic()
        second = _train(work, tmp_path / label / "second", ["a", "b"], {**env, **resume_env},
                        extra=("--resume", "--max-iters", "6"))
        assert time.monotonic() - started < 120
        return second

    naive = first_then_resume("naive", {"SHAREDFS_DISABLE": "1"})
    assert naive[1].returncode != 0, _explain(naive)
    # Whichever rank meets the invisible directory or file first dies of it; its peer then loses gloo.
    errors = "".join(r.stderr for r in naive)
    assert any(f"{err}: [Errno" in errors for err in ("FileExistsError", "FileNotFoundError")), _explain(naive)
    assert 1 not in _reports(tmp_path / "naive" / "second")

    results = first_then_resume("fixed", {})
    assert all(r.returncode == 0 for r in results), _explain(results)
    seen = _reports(tmp_path / "fixed" / "second")
    assert [seen[r]["start_iter"] for r in (0, 1)] == [4, 4]  # both resumed from iter_4, not from scratch
    assert [seen[r]["end_iter"] for r in (0, 1)] == [6, 6]
    chosen = str(mnt / "fixed" / "iter_4.pth")
    assert f"sharedfs: every rank resumes from {chosen} (chosen by rank 0)" in results[0].stdout + results[0].stderr
    import torch

    for name in ("iter_2.pth", "iter_4.pth", "iter_6.pth"):  # every published checkpoint is complete
        assert torch.load(backing / "fixed" / name, map_location="cpu", weights_only=False)["meta"]["iter"] > 0
    assert not [p for p in os.listdir(backing / "fixed") if p.endswith(".tmp")]


LAZY = """
import json, sys
import mmengine


def seen():
    from mmengine.fileio.backends.local_backend import LocalBackend
    from mmengine.registry import HOOKS

    return {"sharedfs loaded": "sharedfs.startup.activation" in sys.modules,
            "mkdir_or_exist patched": hasattr(mmengine.mkdir_or_exist, "__wrapped__"),
            "put patched": hasattr(LocalBackend.put, "__wrapped__"),
            "SharedFSHook registered": "SharedFSHook" in HOOKS._module_dict}


at_import = seen()
from mmengine.runner import Runner  # what a training script imports next
import mmengine.runner.runner as runner_module

after_runner = seen()
after_runner["runner binds the patched mkdir_or_exist"] = (
    runner_module.mmengine.mkdir_or_exist is sys.modules["mmengine.utils"].mkdir_or_exist
    is sys.modules["mmengine.utils.path"].mkdir_or_exist)
print(json.dumps({"at_import": at_import, "after_runner": after_runner}))
"""


def test_import_mmengine_loads_nothing_of_sharedfs_until_the_runner(tmp_path: Path) -> None:
    """``import mmengine`` alone loads nothing of sharedfs (since mmengine 0.10.7 stopped importing torch,
    loading it there cost ~7 % of that import); importing the runner applies the ``mmengine`` shim with its
    siblings, so ``mkdir_or_exist``, the checkpoint backend and ``SharedFSHook`` are in place before any
    ``Runner`` exists, for a program that imported mmengine first."""
    out = subprocess.run([sys.executable, "-c", LAZY], capture_output=True, text=True, timeout=240,
                         env=clean_env({"SHAREDFS_CACHE_ROOT": str(tmp_path)}), cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["at_import"] == {"sharedfs loaded": False, "mkdir_or_exist patched": False, "put patched": False,
                                 "SharedFSHook registered": False}, seen
    assert all(seen["after_runner"].values()), seen

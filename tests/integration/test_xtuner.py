"""Real XTuner 0.2.0: a tiny local Llama fine-tuned through ``process_hf_dataset`` on two simulated nodes.

User story (datasets#6395, LlamaFactory#3065): a user follows the advice to put the
datasets cache on node-local disk and runs ``xtuner train`` on two nodes.  XTuner
prepares the dataset on rank 0 and broadcasts it; a datasets ``Dataset`` pickles
its memory-mapped Arrow files as *paths*, so node b is handed a path that exists
only on node a.  Each rank runs in its own mount namespace with a private tmpfs
at the node-local path (same path string on every node, different contents), as
on a real cluster.  With ``SharedFSHook(cache="node-local")`` each node prepares
its own identical copy and the job trains.

The XTuner stack (torch 2.14.1 + torchvision, ~5.5 GB) lives in its own venv,
built once and reused across sessions (``SHAREDFS_TEST_VENV_CACHE``, default
``/var/tmp/sharedfs-test-venvs``; pinned in ``tests/helpers/xt_requirements.txt``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from harness.skips import skip_or_fail
from helpers import HELPERS, ROOT, Venv, clean_env

from sharedfs.demo.frameworkvenv import cached_venv, install_sharedfs
from sharedfs.demo.ports import free_port

# xdist_group: the XTuner venv and the tiny model, made once per worker.
pytestmark = pytest.mark.xdist_group("xtuner-venv")
TESTS = HELPERS  # the xt_* programs, configs and pins
REQUIREMENTS = TESTS / "xt_requirements.txt"
#: Each simulated node gets its own tmpfs at the same path, in its own mount namespace.
PRIVATE_TMPFS = 'mount -t tmpfs -o mode=1777 sharedfs-node-local "$0" && exec "$@"'
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture(scope="session")
def xtuner_venv(sharedfs_wheel: Path) -> Venv:
    """A venv with the pinned XTuner stack (built once per requirements file) and this sharedfs wheel."""
    def finish(root: Path) -> None:
        env = Venv(root)
        env.pip("install", str(sharedfs_wheel))  # its own dependencies (pluggy, ...) if missing
        # yapf (mmengine's Config.pretty_text) writes its grammar pickle on first use, unlocked and in
        # place: two ranks starting on a fresh install can read it half-written (EOFError).  Not ours
        # to fix here: make it once, in one process.
        env.run("from yapf.yapflib.yapf_api import FormatCode; FormatCode('a = 1\\n')")

    root = cached_venv("xtuner", REQUIREMENTS)
    install_sharedfs(root, sharedfs_wheel, then=finish)
    return Venv(root)


@pytest.fixture(scope="session")
def tiny_llama(xtuner_venv: Venv, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama + BPE tokenizer + Alpaca rows, built locally (no hub)."""
    out = tmp_path_factory.mktemp("tiny_llama")
    proc = subprocess.run([xtuner_venv.python, str(TESTS / "xt_tiny_llama.py"), str(out)], capture_output=True,
                          text=True, env=clean_env(OFFLINE), cwd="/", timeout=300)
    assert proc.returncode == 0, proc.stderr
    return out


def _render_config(tiny: Path, out: Path) -> Path:
    text = (TESTS / "xt_xtuner_config.py").read_text()
    out.write_text(text.replace("@MODEL_DIR@", str(tiny / "model")).replace("@DATA@", str(tiny / "alpaca.jsonl")))
    return out


def _two_node_job(venv: Venv, tiny: Path, base: Path, env: dict[str, str], *, timeout: float = 300
                  ) -> list[tuple[int, str, str]]:
    """Train on 2 ranks, rank 0 on node a and rank 1 on node b, each with a private node-local tmpfs."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        skip_or_fail("node-local disks are simulated with unshare --mount + tmpfs, which needs root")
    local = base / "node-local"
    for d in (local, base / "report", base / "hf_home"):
        d.mkdir(parents=True)
    config = _render_config(tiny, base / "config.py")
    port = str(free_port())
    procs = []
    for rank, node in enumerate(("a", "b")):
        penv = clean_env({**OFFLINE, "PYTHONPATH": str(TESTS), "XT_REPORT": str(base / "report"),
                          "HF_HOME": str(base / "hf_home"), "SHAREDFS_NODE_ID": node, "SHAREDFS_CACHE_ROOT": str(local),
                          "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                          "MASTER_PORT": port, **env})
        argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", PRIVATE_TMPFS, str(local),
                venv.python, str(TESTS / "xt_launch.py"), str(config), str(base / "work")]
        procs.append(subprocess.Popen(argv, env=penv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      cwd="/"))
    out = []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=timeout)
            out.append((proc.returncode, stdout, stderr))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert not any(local.iterdir()), "a node wrote through to the directory under its private tmpfs"
    return out


def _explain(results: list[tuple[int, str, str]]) -> str:
    return "\n".join(f"--- rank {i} exit {code}\n{err[-4000:]}" for i, (code, _, err) in enumerate(results))


def _reports(base: Path) -> dict[int, dict[str, Any]]:
    return {int(p.stem[4:]): json.loads(p.read_text()) for p in (base / "report").glob("rank*.json")}


def test_xtuner_two_nodes_node_local_datasets_cache(xtuner_venv: Venv, tiny_llama: Path, tmp_path: Path) -> None:
    # Without sharedfs: the user's node-local HF_DATASETS_CACHE (the usual advice, datasets#6395).  Rank 0 prepares,
    # broadcasts, and node b cannot open the Arrow files named in what it received.
    naive = _two_node_job(xtuner_venv, tiny_llama, tmp_path / "naive",
                          {"SHAREDFS_DISABLE": "1", "HF_DATASETS_CACHE": str(tmp_path / "naive" / "node-local" / "hf")})
    code_b, _, err_b = naive[1]
    assert code_b != 0, _explain(naive)
    assert "FileNotFoundError" in err_b and "broadcast_object_list" in err_b, _explain(naive)
    assert str(tmp_path / "naive" / "node-local" / "hf") in err_b  # the path that exists only on node a

    # With sharedfs: the config's SharedFSHook(cache="node-local") puts the datasets cache on node-local
    # storage, and process_hf_dataset prepares once per node, identically.
    results = _two_node_job(xtuner_venv, tiny_llama, tmp_path / "fixed", {})
    assert [code for code, _, _ in results] == [0, 0], _explain(results)
    seen = _reports(tmp_path / "fixed")
    assert sorted(seen) == [0, 1]
    assert [seen[r]["end_iter"] for r in (0, 1)] == [3, 3]
    assert seen[0]["policy"]["cache"] == {"value": "node-local", "source": "argument cache"}
    assert seen[0]["dataset"] == seen[1]["dataset"]  # same rows, same order, on both nodes
    log0 = results[0][1] + results[0][2]
    assert "sharedfs policy: lock='auto' (default), cache='node-local' (argument cache)" in log0
    assert "sharedfs: process_hf_dataset prepares on one rank per node (rank 0 on node a" in log0
    assert (tmp_path / "fixed" / "work" / "iter_3.pth").exists()


# Two ranks on node a; rank 0 prepares (a shared cache) with a map function slow enough to miss
# XTUNER_DATASET_TIMEOUT, while rank 1 waits for it in XTuner's monitored barrier.
SLOW_PREPARE = r"""
import os, sys, time
import torch.distributed as dist
from datasets import load_dataset
from transformers import AutoTokenizer
from xtuner.dataset import process_hf_dataset
from xtuner.dataset.map_fns import alpaca_map_fn

def slow_alpaca_map_fn(example):
    time.sleep(0.2)
    return alpaca_map_fn(example)

dist.init_process_group("gloo", init_method="env://")
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
try:
    process_hf_dataset(dataset=load_dataset("json", data_files=sys.argv[2], split="train"), tokenizer=tokenizer,
                       max_length=64, dataset_map_fn=slow_alpaca_map_fn, map_num_proc=1)
except Exception as exc:
    print(f"{type(exc).__name__}: {exc}", flush=True)
    os._exit(3)
"""


def test_xtuner_dataset_timeout_names_the_slow_rank_and_where(xtuner_venv: Venv, tiny_llama: Path,
                                                              tmp_path: Path) -> None:
    """XTUNER_DATASET_TIMEOUT keeps its meaning (minutes); the waiting rank says who is slow and doing what.

    Without sharedfs the same wait ends, after at least a minute (XTuner reads whole minutes only),
    in torch's "received errors while waiting for send/recv from rank 0" and nothing about datasets.
    """
    port = str(free_port())
    procs = []
    for rank in (0, 1):
        env = clean_env({**OFFLINE, "SHAREDFS_NODE_ID": "a", "SHAREDFS_CACHE": "shared", "RANK": str(rank),
                         "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                         "HF_HOME": str(tmp_path / "hf_home"), "XTUNER_DATASET_TIMEOUT": "0.05"})  # 3 s
        # Own session: datasets' map pool children inherit the pipes, so the whole group is killed.
        procs.append(subprocess.Popen([xtuner_venv.python, "-c", SLOW_PREPARE, str(tiny_llama / "model"),
                                       str(tiny_llama / "alpaca.jsonl")], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, cwd="/", start_new_session=True))
    try:
        out, err = procs[1].communicate(timeout=180)
    finally:
        for proc in procs:  # rank 0 would go on preparing for ~20 s: not needed
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    assert procs[1].returncode == 3, err[-3000:]
    assert out.startswith("XtunerDatasetTimeout: dataset preparation did not finish within "
                          "XTUNER_DATASET_TIMEOUT=0.05 min (seen from rank 1 on node a): rank 0 on node a was still "
                          "preparing the dataset"), out
    assert str(tmp_path / "hf_home" / "datasets") in out  # where it is preparing into


def test_catalogue_config_with_sharedfs_hook_loads_in_xtuner(xtuner_venv: Venv, tmp_path: Path) -> None:
    """configs/xtuner/llama2_7b_qlora_alpaca_e3_sharedfs.py: parsed by XTuner's stack, hook built from it."""
    config = ROOT / "configs" / "xtuner" / "llama2_7b_qlora_alpaca_e3_sharedfs.py"
    code = (
        "import sys, sharedfs.machinery.runtime as rt\n"
        "from mmengine.config import Config\n"
        "from mmengine.registry import HOOKS\n"
        "cfg = Config.fromfile(sys.argv[1])\n"
        "hook = HOOKS.build(cfg.custom_hooks[0])\n"
        "print('RESULT', type(hook).__module__, type(hook).__name__, rt.policy().cache, rt.policy().wait_timeout)\n"
        "fn = cfg.train_dataloader.dataset.type\n"
        "print('RESULT', fn.__module__, fn.__name__, hasattr(fn, '__wrapped__'))\n"
    )
    proc = subprocess.run([xtuner_venv.python, "-c", code, str(config)], capture_output=True, text=True,
                          env=clean_env({**OFFLINE, "SHAREDFS_CACHE": "shared"}), cwd=str(tmp_path), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line[len("RESULT "):] for line in proc.stdout.split("\n") if line.startswith("RESULT ")]
    assert lines[0] == "sharedfs.shims.mmengine SharedFSHook node-local 600.0"  # the hook's kwargs beat the env
    # The config's process_hf_dataset is sharedfs's replacement (bound when xtuner.dataset was imported).
    assert lines[1] == "xtuner.dataset.huggingface process_hf_dataset True"

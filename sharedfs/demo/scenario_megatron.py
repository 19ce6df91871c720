"""Megatron's GPT dataset on CPU: a tiny indexed dataset, and gloo ranks that build the datasets from it.

``python -m sharedfs.demo.scenario_megatron prepare PREFIX`` writes ``PREFIX.bin`` / ``PREFIX.idx``
with megatron's own ``IndexedDatasetBuilder`` (400 documents of 20-200 tokens).

``python -m sharedfs.demo.scenario_megatron rank CACHE PREFIX SAMPLES`` is one rank of a job
(``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` in its environment): it joins a gloo group
and runs ``BlendedMegatronDatasetBuilder(GPTDataset, [SAMPLES, None, None], ...)`` with
``path_to_cache=CACHE`` (``CACHE`` may start with ``$SHAREDFS_CACHE_ROOT``: that node's own disk), as
Megatron-LM's ``pretrain_gpt.py`` does, reads a sample, and prints one JSON line: ``{"rank", "node",
"ok", "error", "build": <module of _build_document_sample_shuffle_indices>}``.  Nothing of sharedfs is
called: with sharedfs installed the megatron shim applies at megatron's import.

:func:`start_job`, :func:`finish` and :func:`kill_while_writing` run jobs of such ranks.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Mapping, Sequence

#: Samples of a job whose rank 0 is killed: a shuffle index of 6 MB, long enough to be caught half-written.
MANY = 1_500_000


class TinyTokenizer:
    """What GPTDataset asks of a tokenizer (megatron's ``NullTokenizer`` lives in megatron.training)."""

    vocab_size = 1000
    eod = 999
    pad = 998
    unique_identifiers = {"class": "TinyTokenizer", "vocab_size": 1000}


def _quiet() -> None:
    import warnings

    warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")


def prepare(prefix: str) -> None:
    _quiet()
    import numpy
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    rng = numpy.random.default_rng(0)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=numpy.int32)
    for _ in range(400):
        length = int(rng.integers(20, 200))
        builder.add_document(rng.integers(0, 990, length, dtype=numpy.int32), [length])
    builder.finalize(prefix + ".idx")


def rank(cache: str, prefix: str, samples: int) -> None:
    _quiet()
    import torch.distributed as dist

    me = int(os.environ["RANK"])
    out = {"rank": me, "node": os.environ.get("SHAREDFS_NODE_ID"), "ok": False, "error": None}
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    dist.init_process_group("gloo", rank=me, world_size=int(os.environ["WORLD_SIZE"]), timeout=timedelta(seconds=60))
    # In a training job the ranks reach the dataset build together (model set-up is collective): so here too.
    dist.barrier()
    try:
        out["build"] = GPTDataset._build_document_sample_shuffle_indices.__module__
        config = GPTDatasetConfig(random_seed=1234, sequence_length=16, blend=([prefix], None), split="1,0,0",
                                  path_to_cache=os.path.expandvars(cache), tokenizer=TinyTokenizer(),
                                  reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False)
        train, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, [samples, None, None], lambda: True, config).build()
        assert len(train) >= samples and int(train[len(train) - 1]["tokens"].numel()) == 16
        out["ok"] = True
    except Exception as exc:  # noqa: BLE001 - the caller counts failures by their text
        out["error"] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(out), flush=True)
    # No barrier at the end: a rank whose build failed must not keep the others waiting (they fail their own way).
    os._exit(0 if out["ok"] else 1)


def start_job(cache: str, prefix: str, samples: int, nodes: Sequence[str], env: Mapping[str, str],
              local_root: Path | None = None) -> list[subprocess.Popen[str]]:
    """One job: rank i on simulated node ``nodes[i]``, all in one gloo group."""
    from sharedfs.demo.nodes import node_env
    from sharedfs.demo.ports import free_port

    port = free_port()
    ranks = []
    for index, node in enumerate(nodes):
        rank_env = node_env(node, env, local_root=local_root, RANK=index, WORLD_SIZE=len(nodes),
                            LOCAL_RANK=list(nodes[:index]).count(node), LOCAL_WORLD_SIZE=list(nodes).count(node),
                            MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        ranks.append(subprocess.Popen([sys.executable, "-m", __name__, "rank", cache,
                                       prefix, str(samples)], env=rank_env, cwd="/", stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    return ranks


def finish(ranks: list[subprocess.Popen[str]], timeout: float = 300) -> list[dict]:
    """Every rank's JSON line; a rank that printed none (killed by gloo after a peer failed) is a failure."""
    outcomes = []
    try:
        for index, proc in enumerate(ranks):
            out, err = proc.communicate(timeout=timeout)
            lines = [line for line in out.splitlines() if line.startswith("{")]
            outcomes.append(json.loads(lines[-1]) if lines else {"rank": index, "ok": False, "error": err[-500:]})
    finally:  # Ctrl-C or a timeout: no rank outlives its caller
        for proc in ranks:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return outcomes


def kill_while_writing(cache: Path, prefix: str, env: Mapping[str, str], samples: int = MANY) -> Path:
    """Rank 0 of a one-rank job, SIGKILLed while ``numpy.save`` writes its shuffle index at its final name
    (stock megatron does); returns that file, cut short."""
    (job,) = start_job(str(cache), prefix, samples, ["a"], env)
    deadline = time.monotonic() + 120
    try:
        while True:
            found = list(cache.glob("*-shuffle_index.npy")) if cache.is_dir() else []
            if found and found[0].stat().st_size > 128:  # past numpy's header: the data is being written
                job.send_signal(signal.SIGKILL)  # Slurm preemption, the OOM killer, a time limit
                break
            if job.poll() is not None:
                raise RuntimeError(f"the job ended before it wrote its shuffle index: {job.communicate()[1][-300:]}")
            if time.monotonic() > deadline:
                raise RuntimeError("the job never wrote its shuffle index")
            time.sleep(0.0005)
    finally:
        job.kill()
        job.communicate()
    return found[0]


if __name__ == "__main__":
    if sys.argv[1] == "prepare":
        prepare(sys.argv[2])
    else:
        rank(sys.argv[2], sys.argv[3], int(sys.argv[4]))

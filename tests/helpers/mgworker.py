"""Megatron's GPT dataset on CPU: a tiny indexed dataset, and one gloo rank that builds the datasets from it.

``python mgworker.py prepare PREFIX`` writes ``PREFIX.bin`` / ``PREFIX.idx`` with megatron's own
``IndexedDatasetBuilder`` (400 documents of 20-200 tokens).

``python mgworker.py rank CACHE PREFIX SAMPLES`` is one rank of a job (``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT`` in its environment): it joins a gloo group and runs
``BlendedMegatronDatasetBuilder(GPTDataset, [SAMPLES, None, None], ...)`` with ``path_to_cache=CACHE``
(``CACHE`` may start with ``$SHAREDFS_CACHE_ROOT``: that node's own disk), as Megatron-LM's
``pretrain_gpt.py`` does, reads a sample, and prints one JSON line: ``{"rank", "node", "ok", "error",
"build": <module of _build_document_sample_shuffle_indices>}``.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from datetime import timedelta

warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")


class TinyTokenizer:
    """What GPTDataset asks of a tokenizer (megatron's ``NullTokenizer`` lives in megatron.training)."""

    vocab_size = 1000
    eod = 999
    pad = 998
    unique_identifiers = {"class": "TinyTokenizer", "vocab_size": 1000}


def prepare(prefix: str) -> None:
    import numpy
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    rng = numpy.random.default_rng(0)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=numpy.int32)
    for _ in range(400):
        length = int(rng.integers(20, 200))
        builder.add_document(rng.integers(0, 990, length, dtype=numpy.int32), [length])
    builder.finalize(prefix + ".idx")


def rank(cache: str, prefix: str, samples: int) -> None:
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
    except Exception as exc:  # noqa: BLE001 - the test counts failures by their text
        out["error"] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(out), flush=True)
    # No barrier at the end: a rank whose build failed must not keep the others waiting (they fail their own way).
    os._exit(0 if out["ok"] else 1)


if __name__ == "__main__":
    if sys.argv[1] == "prepare":
        prepare(sys.argv[2])
    else:
        rank(sys.argv[2], sys.argv[3], int(sys.argv[4]))

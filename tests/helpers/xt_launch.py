"""Run an mmengine/XTuner config on CPU: ``python xt_launch.py CONFIG WORK_DIR [--resume] [--max-iters N]``.

The CPU-only glue lives here, never in the shims (issue 6): mmengine 0.10.6's
``init_dist`` calls ``torch.cuda.set_device``, so the gloo group is created first
(mmengine then skips ``init_dist``); DDP gets ``device_ids=None``; torch builds
without ``torch.cpu.is_bf16_supported`` get one answering False (XTuner calls it);
torch >= 2.6 loads mmengine 0.10.6's checkpoints only with ``weights_only=False``.
Ranks come from ``RANK``/``WORLD_SIZE``, else from the index run_on_nodes assigns.
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("work_dir")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--max-iters", type=int)
    args = parser.parse_args(argv)

    os.environ.setdefault("RANK", os.environ.get("SHAREDFS_TEST_INDEX", "0"))
    os.environ.setdefault("WORLD_SIZE", os.environ.get("SHAREDFS_TEST_COUNT", "1"))
    os.environ.setdefault("LOCAL_RANK", "0")  # one rank per simulated node
    world = int(os.environ["WORLD_SIZE"])

    # mmengine 0.10.6 resumes with a bare torch.load, which torch >= 2.6 runs as weights_only=True
    # and refuses its checkpoints (they hold numpy/mmengine objects): a version mismatch, not a
    # filesystem matter, so it is handled here.
    os.environ.setdefault("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    import torch

    if not hasattr(torch.cpu, "is_bf16_supported"):
        torch.cpu.is_bf16_supported = lambda *a, **k: False
    if world > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method="env://")

    from mmengine.config import Config
    from mmengine.runner import Runner

    cfg = Config.fromfile(args.config)
    cfg.work_dir = args.work_dir
    cfg.launcher = "pytorch" if world > 1 else "none"
    if world > 1:
        cfg.model_wrapper_cfg = dict(type="MMDistributedDataParallel", device_ids=None)
    if args.resume:
        cfg.resume = True
    if args.max_iters:
        cfg.train_cfg.max_iters = args.max_iters
    cfg.setdefault("visualizer", None)
    runner = Runner.from_cfg(cfg)
    runner.train()
    if world > 1:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
    print("XT_DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

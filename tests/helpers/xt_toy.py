"""A tiny mmengine model, dataset and probe hook for the integration tests (CPU, a few ms per step).

Imported by the test configs through ``custom_imports``; nothing here is part of sharedfs.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import torch
from mmengine.hooks import Hook
from mmengine.model import BaseModel
from mmengine.registry import DATASETS, HOOKS, MODELS
from torch.utils.data import Dataset

#: Directory (outside the filesystem under test) where each rank writes what it saw.
REPORT_ENV = "XT_REPORT"


@MODELS.register_module()
class XtToyModel(BaseModel):
    """y = w.x + b, trained with MSE."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(2, 1)

    def forward(self, inputs: torch.Tensor, labels: torch.Tensor, mode: str = "tensor") -> Any:
        out = self.linear(inputs)
        if mode == "loss":
            return {"loss": ((out - labels) ** 2).mean()}
        return out


@DATASETS.register_module()
class XtToyDataset(Dataset):
    def __init__(self, size: int = 64) -> None:
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(size, 2, generator=gen)
        self.y = self.x @ torch.tensor([[2.0], [-1.0]]) + 0.5

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"inputs": self.x[i], "labels": self.y[i]}


def _fingerprint(dataset: Any) -> str:
    """A digest of every row, in order: equal on two ranks only if they hold the same dataset."""
    import hashlib

    digest = hashlib.sha256()
    for i in range(len(dataset)):
        digest.update(repr(dataset[i]).encode())
    return f"{len(dataset)}:{digest.hexdigest()}"


@HOOKS.register_module()
class XtProbeHook(Hook):
    """Records, from inside the run, the sharedfs policy and where training started and ended."""

    priority = "LOWEST"

    def __init__(self, pause_before_train: float = 0.0) -> None:
        self.pause = float(os.environ.get("XT_PAUSE_BEFORE_TRAIN", pause_before_train))

    def before_train(self, runner: Any) -> None:
        self.start_iter = runner.iter
        if self.pause:
            time.sleep(self.pause)

    def after_train(self, runner: Any) -> None:
        report = os.environ.get(REPORT_ENV)
        if not report:
            return
        import sharedfs

        policy = sharedfs.policy()
        out = {"rank": runner.rank, "start_iter": self.start_iter, "end_iter": runner.iter,
               "policy": policy.as_dict(), "work_dir": runner.work_dir, "log_dir": runner.log_dir,
               "dataset": _fingerprint(runner.train_dataloader.dataset)}
        with open(os.path.join(report, f"rank{runner.rank}.json"), "w") as f:
            json.dump(out, f)

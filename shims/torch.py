"""PyTorch: ``DataLoader`` worker counts that fit the task's CPUs, for the datasets of patched frameworks.

``num_workers=16`` copied from a workstation config onto a Slurm task that owns
2 CPUs starts 16 processes on 2 cores, and for webdataset/wids every one of them
opens, downloads and caches shards on its own.  ``DataLoader.__init__`` gets the
worker count capped (:mod:`sharedfs.workers`: CPU affinity, ``SLURM_CPUS_PER_TASK``,
the cgroup quota, or ``SHAREDFS_MAX_WORKERS``) -- only for datasets a framework
shim claimed (webdataset and wids register a predicate); any other DataLoader is
built exactly as the user wrote it.
"""

from __future__ import annotations

import functools
import inspect
from types import ModuleType
from typing import Any

from sharedfs import workers
from sharedfs._policy import Policy
from sharedfs.hookspecs import hookimpl
from sharedfs.shim import Shim, ShimContext


class TorchDataLoaderShim(Shim):
    name = "torch"
    # Imported by `import torch`; DataLoader lives in its submodule dataloader.
    target = "torch.utils.data"
    distribution = "torch"
    # DataLoader.__init__'s parameters (dataset, num_workers, ...) are stable from 1.x to 2.x.
    supported = ">=1.13,<3"

    def apply(self, module: ModuleType, policy: Policy, context: ShimContext) -> None:
        loader = module.DataLoader
        self.patcher.setattr(loader, "__init__", make_init(loader.__dict__["__init__"], policy))


def make_init(original: Any, policy: Policy) -> Any:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if workers.PREDICATES:
            try:
                bound = signature.bind(self, *args, **kwargs)
            except TypeError:
                bound = None  # let the real __init__ report the bad call in its own words
            if bound is not None:
                owner = workers.owner(bound.arguments.get("dataset"))
                asked = bound.arguments.get("num_workers", 0)
                if owner is not None and isinstance(asked, int) and asked > 0:
                    used = workers.capped(asked, owner, policy.max_workers)
                    if used != asked:
                        bound.arguments["num_workers"] = used
                        args, kwargs = bound.args[1:], bound.kwargs
        original(self, *args, **kwargs)

    return __init__


@hookimpl
def sharedfs_register_shims() -> list[Shim]:
    return [TorchDataLoaderShim()]

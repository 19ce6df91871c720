"""Process identity from an initialised ``torch.distributed``, else torchrun's variables."""

from __future__ import annotations

import sys
from typing import Mapping

from sharedfs.types import ProcessIdentity, hookimpl


def _int(environ: Mapping[str, str], name: str) -> int | None:
    try:
        return int(environ[name])
    except (KeyError, ValueError):
        return None


@hookimpl(tryfirst=True)  # an initialised process group or torchrun knows better than Slurm
def sharedfs_process_identity(environ: Mapping[str, str]) -> ProcessIdentity | None:
    # Only look at torch if the program already imported it: importing torch costs seconds.
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
        local_rank = _int(environ, "LOCAL_RANK")
        local_world = _int(environ, "LOCAL_WORLD_SIZE")
        if local_rank is None:  # launched without torchrun: fall back to Slurm's view, else a guess
            local_rank = _int(environ, "SLURM_LOCALID") if "SLURM_LOCALID" in environ else None
            local_rank = rank if local_rank is None else local_rank
            local_world = local_world or 1
        return ProcessIdentity(rank, world, local_rank, local_world or 1, source="torch.distributed")
    rank, world = _int(environ, "RANK"), _int(environ, "WORLD_SIZE")
    if rank is not None and world is not None:
        local_rank = _int(environ, "LOCAL_RANK")
        return ProcessIdentity(
            rank, world, rank if local_rank is None else local_rank,
            _int(environ, "LOCAL_WORLD_SIZE") or 1, source="torchrun environment",
        )
    return None

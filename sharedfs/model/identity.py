"""Who this process is in a distributed job: rank, local rank, world size, node (from ``sharedfs_process_identity``)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from sharedfs.model.structs import frozen


@frozen
class ProcessIdentity:
    """This process's place in the job.  ``source`` says which plugin answered."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    node_id: str = ""
    source: str = "single process"

    @property
    def is_leader(self) -> bool:
        """Global rank 0."""
        return self.rank == 0

    @property
    def is_node_leader(self) -> bool:
        """Local rank 0: the one process per node that speaks and prepares node-local data."""
        return self.local_rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


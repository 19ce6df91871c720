"""Slurm: node identity and ranks from ``SLURM_*`` variables.

Under Slurm the node's name is ``SLURMD_NODENAME`` (several slurmd on one host
share a host name but not a node name), contributed as a settings layer below
the environment so an explicit ``SHAREDFS_NODE_ID`` still wins.
"""

from __future__ import annotations

from typing import Mapping

from sharedfs.hookspecs import hookimpl
from sharedfs.identity import ProcessIdentity
from sharedfs.policy import Layer

SLURM_PRIORITY = 150  # above the TOML file (100), below SHAREDFS_* (200)


@hookimpl
def sharedfs_settings_layers(environ: Mapping[str, str]) -> list[Layer]:
    node = environ.get("SLURMD_NODENAME", "").strip()
    if not node:
        return []
    return [Layer("slurm", SLURM_PRIORITY, {"node_id": node}, {"node_id": "SLURMD_NODENAME"})]


@hookimpl
def sharedfs_process_identity(environ: Mapping[str, str]) -> ProcessIdentity | None:
    try:
        rank = int(environ["SLURM_PROCID"])
        world = int(environ["SLURM_NTASKS"])
        local_rank = int(environ.get("SLURM_LOCALID", "0"))
    except (KeyError, ValueError):
        return None
    # SLURM_TASKS_PER_NODE looks like "4(x2),3"; this node's count is not in it directly,
    # and a step may be uneven, so only the common single-value form is trusted.
    per_node = environ.get("SLURM_NTASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE", "1")
    try:
        local_world = int(per_node.split("(")[0].split(",")[0])
    except ValueError:
        local_world = 1
    return ProcessIdentity(rank, world, local_rank, local_world, node_id=environ.get("SLURMD_NODENAME", ""),
                           source="slurm")

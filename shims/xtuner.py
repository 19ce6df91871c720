"""XTuner: ``process_hf_dataset`` prepares data on the right ranks for where the datasets cache lives.

A node-local dataset pickles as a path, so with such a cache each node prepares its own copy.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from datetime import timedelta
from types import ModuleType
from typing import Any, Callable

from sharedfs.types import Policy, Shim, ShimContext, choices, hookimpl

#: XTuner's own variable: minutes to wait for the dataset preparers.
TIMEOUT_ENV = "XTUNER_DATASET_TIMEOUT"
DEFAULT_TIMEOUT_MINUTES = 60.0


class XtunerDatasetTimeout(TimeoutError):
    """Some ranks did not finish (or start) dataset preparation within ``XTUNER_DATASET_TIMEOUT``."""


class XtunerShim(Shim):
    name = "xtuner"
    # The module that defines process_hf_dataset, not the package: ``import xtuner`` (the CLI)
    # does not import it, and when it finishes executing, ``xtuner/dataset/__init__.py`` has not
    # yet bound the name (``from .huggingface import process_hf_dataset`` runs right after), so
    # the package and every later importer bind the replacement.
    distribution = "xtuner"
    # Written against 0.2.0's huggingface.py (process / process_hf_dataset split).
    supported = ">=0.2,<0.3"

    def apply(self, module: ModuleType, policy: Policy, context: ShimContext) -> None:
        original = module.__dict__["process_hf_dataset"]
        replacement = make_process_hf_dataset(original, module.__dict__["process"], policy)
        for name, site in list(sys.modules.items()):
            if name.startswith("xtuner") and getattr(site, "process_hf_dataset", None) is original:
                self.patcher.setattr(site, "process_hf_dataset", replacement)


def timeout_from_env(environ: Any = os.environ) -> timedelta:
    """``XTUNER_DATASET_TIMEOUT`` in minutes (XTuner's meaning), with a clear error for bad values.

    XTuner's own variable, read when ``process_hf_dataset`` runs, as XTuner itself reads it.
    """
    raw = environ.get(TIMEOUT_ENV)
    if raw is None or not raw.strip():
        return timedelta(minutes=DEFAULT_TIMEOUT_MINUTES)
    try:
        minutes = float(raw)
    except ValueError:
        minutes = -1.0
    if not 0 < minutes < float("inf"):
        raise ValueError(f"{TIMEOUT_ENV}={raw!r} is not valid: expected a positive number of minutes "
                         f"(XTuner's default is {DEFAULT_TIMEOUT_MINUTES:g})")
    return timedelta(minutes=minutes)


def make_process_hf_dataset(original: Callable[..., Any], process: Callable[..., Any],
                            policy: Policy) -> Callable[..., Any]:
    @functools.wraps(original)
    def process_hf_dataset(*args: Any, **kwargs: Any) -> Any:
        import torch.distributed as dist  # loaded by then: XTuner's module imports it

        if not (dist.is_available() and dist.is_initialized()):
            return original(*args, **kwargs)
        return _distributed_prepare(dist, process, args, kwargs, policy)

    return process_hf_dataset


def _cache_is_node_local(policy: Policy) -> tuple[bool, str]:
    """Whether this rank's datasets cache is on node-local storage, and the cache directory.

    An explicit ``cache`` setting is the user's word; ``auto`` asks the plugins' classification
    of the filesystem under the cache directory.
    """
    cache = str(sys.modules["datasets.config"].HF_DATASETS_CACHE)
    if policy.cache != "auto":
        return policy.cache == "node-local", cache
    existing = cache
    while existing and not os.path.exists(existing):
        existing = os.path.dirname(existing)
    return not choices.filesystem(existing or "/").shared, cache


def _distributed_prepare(dist: Any, process: Callable[..., Any], args: tuple, kwargs: dict, policy: Policy) -> Any:
    import datasets.config  # noqa: F401 - process() needs it anyway; _cache_is_node_local reads it
    from mmengine.logging import print_log

    timeout = timeout_from_env()
    print_log(f"xtuner_dataset_timeout = {timeout}", logger="current")
    # As XTuner: monitored_barrier needs a gloo group for the host-side sync, with this timeout.
    group = dist.new_group(backend="gloo", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    node_local, cache = _cache_is_node_local(policy)
    table: list[Any] = [None] * world
    # Collective: every rank of the job is in process_hf_dataset (XTuner builds the dataset on all).
    dist.all_gather_object(table, (policy.node_id, node_local, cache), group=group)
    nodes = {r: entry[0] for r, entry in enumerate(table)}
    # Decide once, from rank 0's cache (the one XTuner would broadcast from): every rank gets the
    # same answer, so no rank can take a branch the others do not (KempnerForge#49).
    # With every rank on one node, "one preparer per node" is rank 0: XTuner's broadcast is right then.
    per_node = bool(table[0][1]) and len(set(nodes.values())) > 1
    if per_node:
        preparers = sorted({min(r for r, n in nodes.items() if n == node) for node in set(nodes.values())})
    else:
        preparers = [0]
    where = {r: f"rank {r} on node {nodes[r]} (datasets cache {table[r][2]})" for r in preparers}
    # Through the runner's logger (rank 0 prints it), once per call like XTuner's own timeout line.
    print_log(
        f"sharedfs: process_hf_dataset prepares on {'one rank per node' if per_node else 'rank 0 only'} "
        f"({', '.join(where.values())}): the datasets cache is {'node-local' if per_node else 'shared'}",
        logger="current",
    )
    if not per_node:
        objects = [process(*args, **kwargs) if rank == 0 else None]
        _monitored_barrier(dist, group, timeout, preparers, nodes, table)
        dist.broadcast_object_list(objects, src=0)
        return objects[0]

    import numpy as np

    # Same random choices on every node (np.random.choice for max_dataset_length, an unseeded
    # Dataset.shuffle before packing): identical fingerprints, hence identical datasets.
    state = [np.random.get_state() if rank == 0 else None]
    dist.broadcast_object_list(state, src=0, group=group)
    random_state = state[0]
    assert random_state is not None  # broadcast from rank 0
    if rank in preparers:
        np.random.set_state(random_state)
        dataset = process(*args, **kwargs)
    _monitored_barrier(dist, group, timeout, preparers, nodes, table)
    if rank not in preparers:
        # The node's preparer has published every step into this node's cache: this loads it.
        np.random.set_state(random_state)
        dataset = process(*args, **kwargs)
    return dataset


def _monitored_barrier(dist: Any, group: Any, timeout: timedelta, preparers: list[int], nodes: dict[int, str],
                       table: list[Any]) -> None:
    try:
        dist.monitored_barrier(group=group, timeout=timeout)
    except RuntimeError as exc:
        message = _timeout_message(str(exc), timeout, preparers, nodes, table, dist.get_rank())
        raise XtunerDatasetTimeout(message) from exc


def _late_ranks(error: str, me: int) -> list[int]:
    """The ranks torch's ``monitored_barrier`` error says did not arrive."""
    if me == 0:  # rank 0 checks everyone: "[Rank 0]: Ranks 1, 3 failed to pass monitoredBarrier in ..."
        found = re.search(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier", error)
        return sorted({int(r) for r in re.findall(r"\d+", found.group(1))}) if found else []
    # Other ranks only hear from rank 0: "... received errors while waiting for send/recv from rank 0".
    return [0] if re.search(r"waiting for send/recv from rank 0", error) else []


def _timeout_message(error: str, timeout: timedelta, preparers: list[int], nodes: dict[int, str], table: list[Any],
                     me: int) -> str:
    """Which ranks are late, on which node, and what they were doing."""
    minutes = f"{TIMEOUT_ENV}={timeout.total_seconds() / 60:g} min"
    late = [r for r in _late_ranks(error, me) if r in nodes]
    if not late:
        return (f"rank {me} (node {nodes.get(me)}) could not complete the dataset preparation sync ({minutes}): "
                f"{error.strip().splitlines()[0]}. Another rank probably gave up waiting for this one, or crashed: "
                "see the other ranks' logs. The preparers were "
                + ", ".join(f"rank {r} on node {nodes[r]}" for r in preparers)
                + f"; raise {TIMEOUT_ENV} (minutes) if preparation is just slow.")
    parts = []
    for r in late:
        if r in preparers:
            parts.append(f"rank {r} on node {nodes[r]} was still preparing the dataset (process_hf_dataset: "
                         f"load/map/tokenize/pack into datasets cache {table[r][2]})")
        else:
            parts.append(f"rank {r} on node {nodes[r]} had not reached process_hf_dataset "
                         "(stuck or crashed earlier: model or tokenizer build, another dataset)")
    return (f"dataset preparation did not finish within {minutes} (seen from rank {me} on node {nodes.get(me)}): "
            + "; ".join(parts)
            + f". Look at those ranks' logs (py-spy dump --pid on node {nodes[late[0]]} shows where it is); if "
            f"preparation is just slow, raise {TIMEOUT_ENV} (minutes).")


@hookimpl
def sharedfs_register_shims() -> list[Shim]:
    return [XtunerShim()]

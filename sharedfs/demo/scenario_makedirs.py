"""Six ranks on three nodes create their run directories on a lagging filesystem, with the frameworks' own code.

The programs are the frameworks' code paths as they are, with no ``sharedfs.`` call: what
sharedfs changes in them is ``os.makedirs`` and ``Path.mkdir`` (the ``makedirs`` shim), so
the same program runs first with ``SHAREDFS_DISABLE=1`` and then with sharedfs installed.

* lingua (lingua#49): ``CheckpointManager.__init__`` and ``maybe_run_profiler`` run
  ``os.makedirs(path, exist_ok=True)`` on every rank.  lingua is not on a package index, so
  both are reproduced below line for line from facebookresearch/lingua at
  a38fe06de66fd09c56135dc77bd5fa36ff4febc9, the parent of b29e881 ("fixing makedir potential
  race condition", which moved the call to rank 0 behind a barrier): ``lingua/checkpoint.py``
  lines 37-66 and 104-123, ``lingua/profiling.py`` lines 23-33 and 103-113.  Only the body of
  the profiler's ``with xformers.profiler.profile(...)`` (lines 115-131, which need xformers and a
  model) is replaced by a ``yield``: the directory is made before it.
* torch DCP (pytorch#92553): ``torch.distributed.checkpoint.save`` over gloo, whose
  ``FileSystemWriter.prepare_local_plan`` runs ``FileSystem.mkdir`` -- ``Path(path).mkdir(
  parents=True, exist_ok=True)`` -- on every rank.

The harness orders only what a real job's timing would: node n0's ranks run lingua's calls,
every rank passes a barrier, then the other nodes' ranks run them (inside the filesystem's
lag); then all six save one DCP checkpoint together.  Each step's exception is recorded, so one
run counts both.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Mapping, Sequence

#: The lingua code, reproduced (see the module doc for the commit and the lines).
LINGUA_A38FE06 = r'''
import contextlib
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

import torch
import torch.distributed

# -- lingua/checkpoint.py @ a38fe06, lines 37-66 -------------------------------------------------

FOLDER_NAME = "{:010d}"
RE_FOLDER = r"\d{10}"

RE_CKPT = r"__\d_\d\.distcp"

CONSOLIDATE_FOLDER = "consolidated"
CONSOLIDATE_NAME = "consolidated.pth"

CONFIG_NAME = "params.json"
TRAIN_STATE_NAME = "train_state_{:05d}.json"
RE_DIGITS = re.compile(r"\d+")


@dataclass
class SaveEvery:
    every: int = 1000
    keep: int = 0


@dataclass
class CheckpointArgs:
    dump: SaveEvery = field(default_factory=SaveEvery)
    eval: SaveEvery = field(default_factory=SaveEvery)
    path: Optional[str] = None
    init_ckpt_path: Optional[str] = None
    continue_training_from_init: bool = False


def _get_key_step(name: str):
    return int(re.findall(RE_DIGITS, name)[-1])

# -- lingua/checkpoint.py @ a38fe06, lines 104-123 -----------------------------------------------

class CheckpointManager:
    def __init__(self, args: CheckpointArgs):
        self.path = args.path
        self.dump_every = args.dump
        self.eval_every = args.eval
        self.init_ckpt_path = args.init_ckpt_path
        self.continue_training_from_init = args.continue_training_from_init

        os.makedirs(self.path, exist_ok=True)

        self.existing_saves = self.get_existing_saves()

    def get_existing_saves(self) -> List[Path]:
        folders = [
            p
            for p in Path(self.path).iterdir()
            if p.is_dir() and re.match(RE_FOLDER, p.name)
        ]
        folders.sort(key=lambda p: _get_key_step(p.name))
        return folders

# -- lingua/profiling.py @ a38fe06, lines 23-33 --------------------------------------------------

@dataclass
class ProfilerArgs:
    run: bool = False
    trace_folder: str = "profiling"
    mem_warmup: int = 100
    mem_steps: int = 2
    profile_warmup: int = 102
    profile_steps: int = 2


logger = logging.getLogger()

# -- lingua/profiling.py @ a38fe06, lines 103-113 (then `yield` for the xformers profiler) ------

@contextlib.contextmanager
def maybe_run_profiler(dump_dir, module, config: ProfilerArgs):
    # get user defined profiler settings

    if config.run:
        trace_dir = os.path.join(dump_dir, config.trace_folder)

        logger.info(f"Profiling active.  Traces will be saved at {trace_dir}")

        if not os.path.exists(trace_dir):
            os.makedirs(trace_dir, exist_ok=True)

        yield trace_dir  # lines 115-131: `with xformers.profiler.profile(output_dir=trace_dir, ...)`
'''

#: One rank: lingua's calls (node n0 first), then torch DCP's save; each step's outcome on the last line.
RANK = LINGUA_A38FE06 + r'''

import json, sys
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

dump_dir, ckpt_dir, store = sys.argv[1], sys.argv[2], sys.argv[3]
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world)
steps = {}


def describe(exc):
    """The exception in one line, its path relative to the shared directory (the evidence says which)."""
    if isinstance(exc, OSError) and isinstance(exc.filename, str):
        where = os.path.relpath(exc.filename, os.path.dirname(dump_dir))
        return f"{type(exc).__name__}: [Errno {exc.errno}] {exc.strerror}: {where!r}"
    return f"{type(exc).__name__}: {exc}"


def step(name, call):
    try:
        call()
    except BaseException as exc:  # DCP's CheckpointException is a BaseException
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        failures = getattr(exc, "failures", None)  # CheckpointException: rank -> (exception, traceback)
        if failures:
            first = next(iter(failures.values()))
            inner = first[0] if isinstance(first, tuple) else first
            exc_text = f"{type(exc).__name__} (ranks {sorted(failures)}: {describe(inner)})"
        else:
            exc_text = describe(exc)
        steps[name] = exc_text.splitlines()[0][:200]
    else:
        steps[name] = "ok"


def lingua():
    checkpoint_args = CheckpointArgs(path=os.path.join(dump_dir, "checkpoints"))
    step("lingua CheckpointManager", lambda: CheckpointManager(checkpoint_args))

    def profile():
        with maybe_run_profiler(dump_dir, None, ProfilerArgs(run=True)):
            pass
    step("lingua maybe_run_profiler", profile)


first_node = os.environ["SHAREDFS_NODE_ID"] == "n0"
if first_node:
    lingua()
dist.barrier()
if not first_node:
    lingua()
step("torch DCP save", lambda: dcp.save({"weight": torch.full((4,), float(rank))}, checkpoint_id=ckpt_dir))
dist.destroy_process_group()
print(json.dumps(steps))
'''

STEPS = ("lingua CheckpointManager", "lingua maybe_run_profiler", "torch DCP save")
NODES = 3
RANKS_PER_NODE = 2


def run_ranks(shared: Path, run: str, env: Mapping[str, str], *, timeout: float = 600,
              mounts: Sequence[Path] | None = None) -> list[dict[str, str]]:
    """Run the six ranks (three simulated nodes) on ``shared``; each rank's step outcomes, in rank order.

    ``mounts`` (a real filesystem): node ``n``'s ranks use ``mounts[n]``, its own client's view of ``shared``.
    A rank that died before reporting gets its last stderr line for every step.
    """
    world = NODES * RANKS_PER_NODE
    with tempfile.TemporaryDirectory(prefix="sharedfs-makedirs-") as local:  # the rendezvous is node-local
        store = os.path.join(local, "store")
        procs = []
        for rank in range(world):
            rank_env = {**env, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank % RANKS_PER_NODE),
                        "SHAREDFS_NODE_ID": f"n{rank // RANKS_PER_NODE}"}
            root = mounts[rank // RANKS_PER_NODE] if mounts else shared
            procs.append(subprocess.Popen([sys.executable, "-c", RANK, str(root / run), str(root / f"{run}-dcp"),
                                           store], env=rank_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True, cwd=local))
        results = []
        for proc in procs:
            try:
                out, err = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                for other in procs:
                    other.kill()
                out, err = proc.communicate()
                err += f"\nhung: killed after {timeout:.0f} s"
            lines = [line for line in out.splitlines() if line.startswith("{")]
            if lines:
                results.append(json.loads(lines[-1]))
            else:
                last = ([line for line in err.splitlines() if line.strip()] or [f"exit {proc.returncode}"])[-1]
                results.append({name: f"died: {last.strip()[:200]}" for name in STEPS})
    return results


def tally(results: list[dict[str, str]]) -> dict[str, tuple[int, str]]:
    """Per step: how many ranks succeeded, and the first failure seen (empty when none failed)."""
    out = {}
    for name in STEPS:
        outcomes = [r.get(name, "missing") for r in results]
        failures = [o for o in outcomes if o != "ok"]
        out[name] = (len(outcomes) - len(failures), failures[0] if failures else "")
    return out


def evidence(results: list[dict[str, str]]) -> str:
    """One line: each step's successes out of six, and what the first failure said."""
    parts = []
    for name, (ok, failure) in tally(results).items():
        parts.append(f"{name} {ok}/{len(results)}" + (f" ({failure[:120]})" if failure else ""))
    return "; ".join(parts)

"""A multi-node OLMo-core checkpoint save on a simulated cluster: ranks on simulated nodes, over gloo.

OLMo#829: rank 0 creates the checkpoint directory and every other rank waits a
fixed 10 s until it sees it; on NFS and Lustre other nodes see it later.  This
runs :mod:`sharedfs.demo.olmo_core_rank` (OLMo-core's ``save_state_dict``,
unchanged, no sharedfs call) in ``nodes x per_node`` processes of the OLMo-core
venv (:func:`olmo_core_venv`), each on its simulated node (``SHAREDFS_NODE_ID``,
its own node-local root: :mod:`sharedfs.demo.nodes`), joined by
``torch.distributed`` over gloo on the loopback.  The demo's scenario and
tests/integration/test_olmo_core.py both use it; tests/integration/test_olmo.py runs
OLMo's (ai2-olmo) checkpointer the same way (its own rank program and venv, ``run_job(program=...)``).
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from sharedfs.demo.frameworkvenv import cached_venv
from sharedfs.demo.nodes import node_env
from sharedfs.demo.ports import free_port

__all__ = ["RANK_PROGRAM", "REQUIREMENTS", "Job", "olmo_core_venv", "run_job", "start_job", "summary"]

HERE = Path(__file__).resolve().parent
REQUIREMENTS = HERE / "olmo_core_requirements.txt"
RANK_PROGRAM = HERE / "olmo_core_rank.py"


def olmo_core_venv(note: Callable[[str], None] = lambda line: None) -> Path:
    """The pinned OLMo-core 3.0.0 stack's venv (built once; sharedfs is installed into it separately)."""
    return cached_venv("olmo-core", REQUIREMENTS, note=note)


def run_job(python: str, target: Path, env: Mapping[str, str], *, local_root: Path, nodes: int = 3,
            per_node: int = 2, timeout: float = 240, program: Path = RANK_PROGRAM) -> list[dict[str, Any]]:
    """Every rank saves a checkpoint to ``target``; one report per rank, in rank order (never hangs)."""
    return start_job(python, target, env, local_root=local_root, nodes=nodes, per_node=per_node,
                     program=program).reports(timeout)


class Job:
    """The rank processes of one job, started; :meth:`reports` collects them."""

    def __init__(self, procs: list[subprocess.Popen[str]]) -> None:
        self.procs = procs

    def reports(self, timeout: float) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        reports = []
        try:
            for rank, proc in enumerate(self.procs):
                try:
                    out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    out, err = proc.communicate()
                    err += f"\nhung: killed after {timeout:.0f} s"
                reports.append(_report(rank, proc.returncode, out, err))
        finally:
            for proc in self.procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        return reports


def start_job(python: str, target: Path, env: Mapping[str, str], *, local_root: Path, nodes: int = 3,
              per_node: int = 2, program: Path = RANK_PROGRAM) -> Job:
    """Start ``program`` (a rank program printing one JSON report, as :data:`RANK_PROGRAM`) in every rank:
    rank ``node * per_node + local`` on node ``n<node>``.  Collect with :meth:`Job.reports`."""
    port = str(free_port())
    world = nodes * per_node
    procs: list[subprocess.Popen[str]] = []
    try:
        for node in range(nodes):
            for local in range(per_node):
                penv = node_env(f"n{node}", env, local_root=local_root, RANK=node * per_node + local,
                                WORLD_SIZE=world, LOCAL_RANK=local, LOCAL_WORLD_SIZE=per_node, NODE_RANK=node,
                                MASTER_ADDR="127.0.0.1", MASTER_PORT=port, OMP_NUM_THREADS=1)
                procs.append(subprocess.Popen([python, str(program), str(target)], env=penv, cwd="/",
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    except BaseException:
        for proc in procs:
            proc.kill()
            proc.wait()
        raise
    return Job(procs)


def _report(rank: int, code: int, out: str, err: str) -> dict[str, Any]:
    for line in reversed(out.strip().splitlines()):
        if line.startswith("{"):
            report: dict[str, Any] = json.loads(line)
            report.update(returncode=code, stderr=err)
            return report
    lines = [line for line in err.strip().splitlines() if line.strip()]
    return {"rank": rank, "ok": False, "error": (lines or [f"exit {code}, no output"])[-1][:300],
            "returncode": code, "stderr": err}


#: How a failed rank's error is counted, in the order the summary lists them: the filesystem's failures first.
ORDER = ("TimeoutError", "FileExistsError")


def summary(reports: list[dict[str, Any]]) -> str:
    """``"6/6 ranks saved"`` or ``"0/6 ranks saved; 4 TimeoutError, 2 lost a peer (RuntimeError)"``."""
    saved = sum(1 for r in reports if r["ok"])
    text = f"{saved}/{len(reports)} ranks saved"
    kinds: dict[str, int] = {}
    for r in reports:
        if not r["ok"]:
            error = str(r["error"])
            kind = error.partition(":")[0]
            if "closed by peer" in error or "Connection reset" in error:
                kind = f"lost a peer ({kind})"  # gloo: another rank died first
            kinds[kind] = kinds.get(kind, 0) + 1
    rank = {kind: (ORDER.index(kind) if kind in ORDER else len(ORDER)) for kind in kinds}
    if kinds:
        text += "; " + ", ".join(f"{kinds[kind]} {kind}" for kind in sorted(kinds, key=lambda k: (rank[k], -kinds[k])))
    return text

"""``sharedfs doctor --cross-node PATH``: probe a shared path *between* nodes.

A single-node probe (:mod:`sharedfs.commands.probe`) cannot see the silent failure: on
GPFS, Lustre ``-o localflock`` and NFS ``local_lock=...`` a ``flock``
succeeds and excludes other processes of the same node only, so two nodes
both "hold" the lock (filelock#389, granite.build#322, claude-swap#372).  Run
this as one task per node, e.g.::

    srun -N 2 --ntasks-per-node=1 sharedfs doctor --cross-node /shared/path

The tasks meet in ``PATH/.sharedfs-crossnode-<job>.<step>`` (files only, no
network: the path under test is the only channel) and the first node's task
(the *leader*) holds each lock while every other node tries it:

``flock`` / ``posix``  another node's ``LOCK_EX|LOCK_NB`` while the leader
                      holds the lock: ``EWOULDBLOCK`` -> ``coherent``;
                      success -> ``node-local``; ENOSYS/ENOLCK -> ``unsupported``
``o_excl``            every node races ``O_CREAT|O_EXCL`` on the same names;
                      two winners for one name -> not atomic across nodes
``visibility``        seconds until a file created on one node is seen on the
                      others (NFS attribute / lookup caches; OLMo#829)

Every node prints its own view (``--json``: one JSON object per line, so
``srun``'s merged output stays parseable); the leader also prints the verdict
for the path.  Extra tasks on a node (local rank > 0) print only that they idled.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from sharedfs.fs import oslocks
from sharedfs.fs.publish import publish
from sharedfs.fs.safefile import read_untrusted
from sharedfs.machinery import choices, runtime

__all__ = ["CrossNodeError", "run"]

POLL = 0.02
EXCL_NAMES = 20
#: A node's posted report is a few kB of JSON; anything longer was not written by a task of this probe.
REPORT_LIMIT = 1 << 20


class CrossNodeError(RuntimeError):
    """The cross-node probe cannot run or did not complete; the message says why."""


class _Meeting:
    """File-based rendezvous of one task per node in ``workdir``."""

    def __init__(self, workdir: Path, node: str, nodes: int, timeout: float) -> None:
        self.dir = workdir
        self.node = node
        self.nodes = nodes
        self.timeout = timeout

    def _names(self) -> list[str]:
        try:
            return os.listdir(self.dir)  # a fresh readdir revalidates NFS's directory cache
        except FileNotFoundError:
            return []

    def post(self, name: str, data: Any = None) -> None:
        # Whole or not at all: other nodes poll for the name and read it at once.
        publish(self.dir / f"{name}@{self.node}", json.dumps(data), durable=False)

    def gather(self, name: str) -> dict[str, Any]:
        """Wait until every node posted ``name``; returns {node: data}."""
        deadline = time.monotonic() + self.timeout
        prefix = f"{name}@"
        while True:
            found = [n for n in self._names() if n.startswith(prefix)]
            if len(found) >= self.nodes:
                out = {}
                for entry in found:
                    # The path under test is shared: any member may plant a FIFO, a symlink or a huge file
                    # under a node's name. Read it as untrusted (no blocking open, no symlink, a size cap).
                    try:
                        read = read_untrusted(str(self.dir / entry), REPORT_LIMIT)
                        if read is None:
                            break  # not a report a task published: wait for the real ones (or the timeout)
                        out[entry[len(prefix):]] = json.loads(read[0])
                    except (OSError, ValueError):
                        break  # visible but not yet readable here: look again
                else:
                    return out
            if time.monotonic() > deadline:
                seen = sorted(n[len(prefix):] for n in found)
                raise CrossNodeError(
                    f"waited {self.timeout:g} s in {self.dir} for {self.nodes} nodes at step {name!r}, saw "
                    f"{seen or 'none'}. Start exactly one task per node (srun --ntasks-per-node=1), or raise "
                    "--timeout if new files reach other nodes this late.")
            time.sleep(POLL)

    def barrier(self, name: str) -> dict[str, Any]:
        self.post(name)
        return self.gather(name)


def _try_lock(path: Path, kind: str) -> tuple[str, str | None]:
    """('held'|'blocked'|'failed', errno name) for a non-blocking exclusive lock on a fresh fd."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        return oslocks.try_lock(fd, kind)
    finally:
        os.close(fd)  # closing drops either kind of lock


def _lock_probe(meet: _Meeting, leader: bool, kind: str) -> dict[str, Any]:
    path = meet.dir / f"{kind}.lck"
    if leader:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            state, failure = oslocks.try_lock(fd, kind)
            if state != "held":
                meet.post(f"{kind}-held", {"held": False})
                meet.barrier(f"{kind}-tried")
                return {"result": "unsupported", "errno": failure, "role": "holder"}
            meet.post(f"{kind}-held", {"held": True})
            tried = meet.barrier(f"{kind}-tried")
        finally:
            os.close(fd)
        others = {node: data for node, data in tried.items() if node != meet.node and data}
        if not others:
            return {"result": "unsupported", "role": "holder"}
        results = {data["result"] for data in others.values()}
        verdict = "node-local" if "node-local" in results else results.pop() if len(results) == 1 else "mixed"
        return {"result": verdict, "role": "holder", "others": others}
    meet.post(f"{kind}-held", None)  # members post too, so one gather sees the holder's answer
    holder = meet.gather(f"{kind}-held")
    if not any(data and data.get("held") for data in holder.values()):
        meet.barrier(f"{kind}-tried")
        return {"result": "unsupported", "role": "tried", "detail": "the holder could not take the lock"}
    state, failure = _try_lock(path, kind)
    mine = {"held": "node-local", "blocked": "coherent", "failed": "unsupported"}[state]
    report = {"result": mine, "errno": failure,
              "detail": {"held": f"got the {kind} lock while another node held it: it excludes only its own node",
                         "blocked": f"the {kind} lock held on another node excluded this node",
                         "failed": f"{kind} failed with {failure}"}[state]}
    meet.post(f"{kind}-tried", report)
    meet.gather(f"{kind}-tried")
    return {**report, "role": "tried"}


def _excl_probe(meet: _Meeting) -> dict[str, Any]:
    meet.barrier("excl-start")
    won = []
    for i in range(EXCL_NAMES):
        try:
            os.close(os.open(meet.dir / f"excl-{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        except FileExistsError:
            continue
        won.append(i)
    meet.post("excl-won", won)
    everyone = meet.gather("excl-won")
    claims: dict[int, list[str]] = {}
    for node, names in everyone.items():
        for i in names:
            claims.setdefault(i, []).append(node)
    doubles = {i: nodes for i, nodes in claims.items() if len(nodes) > 1}
    missing = [i for i in range(EXCL_NAMES) if i not in claims]
    return {"result": "atomic" if not doubles and not missing else "NOT atomic",
            "won_here": len(won), "double_winners": doubles, "unclaimed": missing}


def _visibility_probe(meet: _Meeting, timeout: float) -> dict[str, Any]:
    meet.barrier("vis-start")
    (meet.dir / f"appear.{meet.node}").write_text(meet.node)
    seen_after: dict[str, float] = {}
    start = time.monotonic()
    expected = set(meet.gather("vis-start")) - {meet.node}
    while True:
        names = set(os.listdir(meet.dir))
        others = {n[len("appear."):] for n in names if n.startswith("appear.")} - {meet.node}
        for node in others - set(seen_after):
            seen_after[node] = round(time.monotonic() - start, 3)
        pending = expected - set(seen_after)
        if not pending or time.monotonic() - start > timeout:
            break
        time.sleep(POLL)
    meet.barrier("vis-done")
    return {"result": "ok" if not pending else "late", "seconds_until_seen": seen_after,
            "never_seen": sorted(pending)}


def run(path: str, *, timeout: float = 30.0) -> dict[str, Any]:
    """This task's part of the cross-node probe of ``path``; the report of this node (and the verdict if leader)."""
    ident = runtime.identity()
    node = runtime.policy().node_id
    job = os.environ.get("SLURM_JOB_ID")
    step = os.environ.get("SLURM_STEP_ID", "0")
    nodes_text = os.environ.get("SLURM_STEP_NUM_NODES") or os.environ.get("SLURM_NNODES") or ""
    if not job or not nodes_text.isdigit():
        raise CrossNodeError("--cross-node runs as one task per node of a Slurm step, e.g. "
                             "`srun -N 2 --ntasks-per-node=1 sharedfs doctor --cross-node PATH`; "
                             "SLURM_JOB_ID / SLURM_STEP_NUM_NODES are not set here")
    nodes = int(nodes_text)
    base = Path(path).resolve()
    if not base.is_dir():
        raise CrossNodeError(f"{base} is not a directory on node {node}: give the shared directory to probe")
    report: dict[str, Any] = {"node": node, "rank": ident.rank, "path": str(base)}
    if ident.local_rank != 0:
        report["role"] = "idle"
        report["detail"] = "one task per node probes; this is an extra task on the node"
        return report
    if nodes < 2:
        raise CrossNodeError("--cross-node needs tasks on at least 2 nodes (srun -N 2 ...)")
    workdir = base / f".sharedfs-crossnode-{job}.{step}"
    try:
        os.mkdir(workdir)
    except FileExistsError:
        pass
    meet = _Meeting(workdir, node, nodes, timeout)
    hello = meet.barrier("hello")
    leader = min(hello) == node
    if len(hello) != nodes:
        raise CrossNodeError(f"expected {nodes} nodes, met {sorted(hello)}: are two tasks reporting the same node id?")
    report.update(role="leader" if leader else "member", nodes=sorted(hello))
    probes = {
        "visibility": _visibility_probe(meet, timeout),
        "flock": _lock_probe(meet, leader, "flock"),
        "posix": _lock_probe(meet, leader, "posix"),
        "o_excl": _excl_probe(meet),
    }
    report["probes"] = probes
    meet.post("report", probes)
    everyone = meet.gather("report")
    if leader:
        report["verdict"] = _verdict(everyone, str(base))
        meet.barrier("bye")  # nobody reads the meeting place any more
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        meet.post("bye")
    return report


def _verdict(reports: dict[str, Any], path: str) -> dict[str, Any]:
    """One answer for the path from every node's view, and the lock the plugins choose for what was seen."""
    def combined(kind: str) -> str:
        results = {r[kind]["result"] for r in reports.values()}
        for worst in ("node-local", "unsupported", "mixed", "NOT atomic", "late"):
            if worst in results:
                return worst
        return results.pop() if len(results) == 1 else "mixed"

    verdict = {kind: combined(kind) for kind in ("flock", "posix", "o_excl", "visibility")}
    # What was observed, in the classification's vocabulary (a mixed answer counts as the weaker
    # node-local), handed to the same decision every lock takes (plugins/locking.py).
    state = {"coherent": "coherent", "unsupported": "absent"}
    seen = replace(choices.filesystem(path), shared=True, flock=state.get(verdict["flock"], "node-local"),
                   posix=state.get(verdict["posix"], "node-local"), o_excl_atomic=verdict["o_excl"] == "atomic")
    choice = runtime.registry().choose_lock(os.path.join(path, "probe.lock"), seen, runtime.policy(lock="auto"))
    verdict["lock_to_use"] = choice.kind
    verdict["lock_reason"] = choice.reason
    return verdict


def format_report(report: dict[str, Any]) -> str:
    """Human-readable lines for one node's report."""
    lines = [f"node {report['node']} (rank {report['rank']}, {report.get('role')}): {report['path']}"]
    if report.get("role") == "idle":
        lines.append(f"  {report['detail']}")
        return "\n".join(lines)
    for name, probe in report["probes"].items():
        detail = probe.get("detail") or ""
        if probe.get("others"):
            detail = "tried from " + ", ".join(f"{n}: {d['result']}" for n, d in sorted(probe["others"].items()))
        if name == "visibility":
            detail = ", ".join(f"{n} after {s:.2f} s" for n, s in probe["seconds_until_seen"].items())
        elif name == "o_excl":
            doubles = probe["double_winners"] or "none"
            detail = f"{probe['won_here']} of {EXCL_NAMES} names won here; double winners: {doubles}"
        lines.append(f"  {name:<11} {probe['result']:<12} {detail}")
    if "verdict" in report:
        v = report["verdict"]
        lines.append(f"  verdict across nodes: flock {v['flock']}, POSIX locks {v['posix']}, O_EXCL {v['o_excl']}, "
                     f"visibility {v['visibility']}; use a {v['lock_to_use']} lock here")
    return "\n".join(lines)

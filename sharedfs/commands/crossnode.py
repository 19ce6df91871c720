"""``sharedfs doctor --cross-node PATH``: probe a shared path *between* nodes (one task per node under ``srun``).

A node-local flock looks fine from one node; nothing outside the 0700 meeting place is touched (docs/cli.md).
"""

from __future__ import annotations

import json
import os
import stat
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from sharedfs.fs import oslocks
from sharedfs.fs.directory import Changed, Directory, identity
from sharedfs.fs.recordfile import create_record_in
from sharedfs.machinery import choices, runtime

__all__ = ["CrossNodeError", "run"]

POLL = 0.02
EXCL_NAMES = 20
#: A node's posted report is a few kB of JSON; anything longer was not written by a task of this probe.
REPORT_LIMIT = 1 << 20
#: The record the task that made the meeting place writes in it first: the job step it is for.
MADE = "made"


class CrossNodeError(RuntimeError):
    """The cross-node probe cannot run or did not complete; the message says why."""


class _Meeting:
    """File-based rendezvous of one task per node in the meeting place, held open as ``place``."""

    def __init__(self, place: Directory, node: str, nodes: int, timeout: float) -> None:
        self.place = place
        self.node = node
        self.nodes = nodes
        self.timeout = timeout

    def names(self) -> list[str]:
        # A fresh open (of ".", relative to the one held) and readdir revalidates NFS's directory cache.
        with self.place.subdirectory(".") as fresh:
            return [entry.name for entry in fresh.listing()]

    def create(self, name: str, data: str) -> None:
        """Make the new file ``name`` here, holding ``data``: FileExistsError if the name exists in any form."""
        os.close(create_record_in(self.place, name, data.encode(), 0o600))

    def post(self, name: str, data: Any = None) -> None:
        # Whole or not at all: other nodes poll for the name and read it at once.
        final = f"{name}@{self.node}"
        temp = f".{final}.{os.getpid()}.tmp"
        self.create(temp, json.dumps(data))
        os.rename(temp, final, src_dir_fd=self.place.fd, dst_dir_fd=self.place.fd)

    def gather(self, name: str) -> dict[str, Any]:
        """Wait until every node posted ``name``; returns {node: data}."""
        deadline = time.monotonic() + self.timeout
        prefix = f"{name}@"
        while True:
            found = [n for n in self.names() if n.startswith(prefix)]
            if len(found) >= self.nodes:
                out = {}
                for entry in found:
                    # Only the job's user can write here, but read every post as untrusted anyway (no blocking
                    # open, no symlink, a size cap): a FIFO or a huge file under a node's name never hangs us.
                    try:
                        read = self.place.read_untrusted(entry, REPORT_LIMIT)
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
                    f"waited {self.timeout:g} s in {self.place.path} for {self.nodes} nodes at step {name!r}, saw "
                    f"{seen or 'none'}. Start exactly one task per node (srun --ntasks-per-node=1), or raise "
                    "--timeout if new files reach other nodes this late.")
            time.sleep(POLL)

    def barrier(self, name: str) -> dict[str, Any]:
        self.post(name)
        return self.gather(name)


def _try_lock(meet: _Meeting, name: str, kind: str) -> tuple[str, str | None]:
    """('held'|'blocked'|'failed', errno name) for a non-blocking exclusive lock on a fresh fd of the holder's file."""
    fd = meet.place.open_file(name, os.O_RDWR)
    try:
        return oslocks.try_lock(fd, kind)
    finally:
        os.close(fd)  # closing drops either kind of lock


def _lock_probe(meet: _Meeting, leader: bool, kind: str) -> dict[str, Any]:
    name = f"{kind}.lck"
    if leader:
        fd = meet.place.create_exclusive(name, 0o600)
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
    state, failure = _try_lock(meet, name, kind)
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
            os.close(meet.place.create_exclusive(f"excl-{i}", 0o600))
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
    meet.create(f"appear.{meet.node}", meet.node)
    seen_after: dict[str, float] = {}
    start = time.monotonic()
    expected = set(meet.gather("vis-start")) - {meet.node}
    while True:
        names = set(meet.names())
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
    if os.sep in job + step:
        raise CrossNodeError(f"SLURM_JOB_ID {job!r} / SLURM_STEP_ID {step!r} are not a Slurm job and step id")
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
    try:
        parent = Directory.open(str(base))  # held for the whole run: the meeting place is found and removed in it
    except OSError as exc:
        raise CrossNodeError(f"cannot open {base} on node {node}: {exc.strerror or exc}") from None
    with parent:
        with _meeting_place(parent, f".sharedfs-crossnode-{job}.{step}", f"{job}.{step}", node, timeout) as place:
            meet = _Meeting(place, node, nodes, timeout)
            if _meet(meet, report, str(base)):  # the leader: it heard every node's bye, nobody reads here any more
                report["cleanup"] = _remove(parent, place)
    return report


def _meet(meet: _Meeting, report: dict[str, Any], base: str) -> bool:
    """The probes, in the meeting place; this node's findings (and the leader's verdict) go into ``report``.

    True for the leader, which waits for every other node's bye (and so prints last, after srun merged theirs).
    """
    hello = meet.barrier("hello")
    leader = min(hello) == meet.node
    if len(hello) != meet.nodes:
        raise CrossNodeError(f"expected {meet.nodes} nodes, met {sorted(hello)}: are two tasks reporting the same "
                             "node id?")
    report.update(role="leader" if leader else "member", nodes=sorted(hello))
    probes = {
        "visibility": _visibility_probe(meet, meet.timeout),
        "flock": _lock_probe(meet, leader, "flock"),
        "posix": _lock_probe(meet, leader, "posix"),
        "o_excl": _excl_probe(meet),
    }
    report["probes"] = probes
    meet.post("report", probes)
    everyone = meet.gather("report")
    if leader:
        report["verdict"] = _verdict(everyone, base)
        meet.barrier("bye")
    else:
        meet.post("bye")  # this node reads nothing here any more
    return leader


# -- the meeting place --------------------------------------------------------------------------------


def _meeting_place(parent: Directory, name: str, step: str, node: str, timeout: float) -> Directory:
    """The meeting place ``name`` in ``parent``, open and checked.

    The first task to ``mkdir`` it makes it ``0700``; the others find it there.  Whoever else may
    write ``parent`` may have put something at that name, or swap it in between the ``mkdir`` and
    the open: it is opened once without following a symlink and used only if it is a directory of
    the job's user that nobody else may enter, empty (the task that made it) or holding the record
    of this job step that task writes first (every other task).
    """
    try:
        os.mkdir(name, 0o700, dir_fd=parent.fd)
        made = True
    except FileExistsError:
        made = False
    except OSError as exc:
        raise CrossNodeError(f"cannot create the meeting place {parent.join(name)} on node {node}: "
                             f"{exc.strerror or exc}") from None
    try:
        place = parent.subdirectory(name)
    except Changed:
        raise _refused(parent, name, "it is a symlink or a file, not a directory") from None
    except FileNotFoundError:
        raise _refused(parent, name, "it was removed or renamed as soon as it was made") from None
    try:
        _check_private(parent, place, name, node, made)
        if made:
            os.close(create_record_in(place, MADE, json.dumps({"step": step, "node": node}).encode(), 0o600))
        else:
            _wait_for_record(parent, place, name, step, timeout)
    except BaseException:
        place.close()
        raise
    return place


def _check_private(parent: Directory, place: Directory, name: str, node: str, made: bool) -> None:
    """Refuse ``place`` unless only the job's user may change it (and, if this task made it, it is empty)."""
    st = place.stat()
    if st.st_mode & 0o077:
        raise _refused(parent, name, f"it is mode {stat.S_IMODE(st.st_mode):o}, not the 0700 a task of this step "
                       "makes it")
    if made and place.listing():
        raise _refused(parent, name, "it is not the empty directory this task just made")
    if st.st_uid != _creator(parent, name, node, st.st_uid):
        raise _refused(parent, name, f"it belongs to uid {st.st_uid}, not to the user running this job")


def _creator(parent: Directory, name: str, node: str, owner: int) -> int:
    """The owner this filesystem gives what this process creates in ``parent`` (``owner``: the meeting place's).

    This user; or the uid an NFS export squashes root to, or an unmapped NFSv4 user to (then the
    owner of the directory its task made too), learnt from a file made beside it (not in a place
    not yet trusted) and removed at once.
    """
    if owner == os.geteuid():
        return owner
    probe = f"{name}.owner@{node}"
    try:
        fd = parent.create_exclusive(probe, 0o600)
    except OSError:
        return -1  # cannot tell: not a place to trust
    try:
        return os.fstat(fd).st_uid
    finally:
        parent.discard_if_same(probe, identity(fd))
        os.close(fd)


def _wait_for_record(parent: Directory, place: Directory, name: str, step: str, timeout: float) -> None:
    """Wait (up to ``timeout``) for the record of job step ``step`` the task that made ``place`` writes first."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            read = place.read_untrusted(MADE)
            if read is not None and json.loads(read[0]).get("step") == step:
                return
        except (OSError, ValueError, AttributeError):
            pass  # not there yet (or not yet whole on this node): look again
        if time.monotonic() > deadline:
            raise _refused(parent, name, f"no task of job step {step} made it (after {timeout:g} s it holds no "
                           "record of one)")
        time.sleep(POLL)


def _refused(parent: Directory, name: str, why: str) -> CrossNodeError:
    fix = ("" if parent.stat().st_mode & stat.S_ISVTX else
           f": any writer of {parent.path} can put one there, as it is not sticky (`chmod +t {parent.path}` stops it)")
    return CrossNodeError(f"{parent.join(name)} is not a meeting place a task of this job made ({why}), so nothing "
                          f"was tested{fix}. Run the probe again in a new job step (a new name).")


def _remove(parent: Directory, place: Directory) -> str:
    """Empty the meeting place through its descriptor; remove it while its name is still it."""
    try:
        for entry in place.listing():  # only the job's user can have made these: it is private, and was checked so
            if not entry.is_dir(follow_symlinks=False):
                try:
                    os.unlink(entry.name, dir_fd=place.fd)
                except FileNotFoundError:
                    pass
        name = os.path.basename(place.path)
        if not parent.names(name, identity(place.fd)):
            return (f"emptied the meeting place, but it is no longer at {place.path} (someone renamed it): the empty "
                    "directory stays where it was moved")
        # Between that look and this rmdir only an empty directory can go: anyone who could have renamed ours away
        # (a writer of a directory that is not sticky) may remove an empty directory there too.
        os.rmdir(name, dir_fd=parent.fd)
    except OSError as exc:
        return f"left the meeting place {place.path}: {exc.strerror or exc}"
    return f"removed {place.path}"


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
    if not report.get("cleanup", "removed").startswith("removed"):
        lines.append(f"  cleanup    : {report['cleanup']}")
    return "\n".join(lines)

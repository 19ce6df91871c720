"""``sharedfs doctor``: what a path's filesystem and locks do, what sharedfs does there, what would help.

The probes live in ``probe``, ``crossnode`` and ``teamscan``; this module turns their findings into the report.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from sharedfs import __version__
from sharedfs.commands.exits import EXIT_OK, EXIT_USAGE, stderr_line
from sharedfs.commands.teamscan import team_check, team_lines

#: What users see from their tools when a probe fails with this errno (datasets#6395, datasets#1672).
SYMPTOMS = {
    "ENOSYS": "filelock < 3.24 and datasets raise \"FileSystem does not appear to support flock\"",
    "ENOLCK": "filelock, datasets and wids raise \"[Errno 37] No locks available\" (no filelock release falls back)",
}

#: Human names of the filesystem kinds ``sharedfs_classify_filesystem`` answers.
KIND_NAMES = {
    "lustre": "Lustre", "gpfs": "GPFS (IBM Storage Scale)", "nfs": "NFS", "beegfs": "BeeGFS", "cephfs": "CephFS",
    "cifs": "SMB/CIFS", "juicefs": "JuiceFS", "moosefs": "MooseFS", "glusterfs": "GlusterFS", "3fs": "3FS",
    "bucket": "an object-store bucket mount", "fuse": "a FUSE filesystem",
    "overlay": "an overlay filesystem (container layers)", "tmpfs": "tmpfs (memory)", "local": "a local disk",
    "unknown": "an unknown filesystem",
}


def filesystem_name(fs: Any) -> str:
    """The filesystem by name ("JuiceFS", "gcsfuse (a Cloud Storage bucket)"), else by kind ("a FUSE filesystem")."""
    return fs.name or KIND_NAMES.get(fs.kind, fs.kind)


def lock_choice_or_refusal(lock_file: str, policy: Any) -> Any:
    """The plugins' lock choice for ``lock_file``, or a choice of kind ``none`` saying why no lock is taken there."""
    from sharedfs.errors import NoSafeLockError
    from sharedfs.machinery import choices
    from sharedfs.model.policy import LockChoice

    try:
        return choices.lock_choice(lock_file, policy)
    except NoSafeLockError as exc:
        return LockChoice("none", str(exc))


def handover_line(fs: Any) -> str | None:
    """How long a lock's next holder waits here after a holder on another node, and where that comes from
    (read from the client, declared by a site plugin, or assumed); ``None`` for storage only this node sees."""
    from sharedfs.locks import _handover

    return _handover.settle_line(fs) if fs.shared else None


def doctor_report(path: str) -> dict[str, Any]:
    from sharedfs.commands.probe import probe
    from sharedfs.machinery import choices, runtime

    path = os.path.abspath(path)
    fs = choices.filesystem(path)
    current = runtime.policy()
    choice = lock_choice_or_refusal(os.path.join(path, ".sharedfs-doctor.lock"), current)
    auto = lock_choice_or_refusal(os.path.join(path, ".sharedfs-doctor.lock"), runtime.policy(lock="auto"))
    probes = probe(path)
    return {
        "path": path,
        "filesystem": {**fs.as_dict(), "safe_lock": auto.kind if auto.kind in ("flock", "posix") else None},
        "probes": probes,
        "lock": {"kind": choice.kind, "reason": choice.reason, "marker": choice.marker},
        "handover": handover_line(fs),
        "cache": {"mode": current.cache, "source": current.source("cache")},
        "warnings": _doctor_warnings(fs, probes, choice.kind),
        "verdict": _doctor_verdict(path, fs, probes, choice, off=sharedfs_off(current)),
        "sharedfs_off": sharedfs_off(current),
        "conflicts": dict(current.conflicts),
        "team": team_check(path, current),
    }


def _doctor_warnings(fs: Any, probes: dict[str, Any], lock_kind: str) -> list[str]:
    """Plain-language warnings from what the probes observed, then from what the classification knows."""
    warnings = []
    uses = "no lock (NoSafeLockError)" if lock_kind == "none" else f"a {lock_kind} lock"
    if not probes.get("writable", True):
        warnings.append(f"not writable here ({probes.get('error')}): sharedfs cannot place locks or caches here")
    results = probes.get("results", {})
    flock = results.get("flock", {})
    if flock.get("errno"):
        symptom = SYMPTOMS.get(flock["errno"], "tools that rely on flock fail here")
        warnings.append(f"flock fails here with {flock['errno']}: {symptom}; sharedfs uses {uses}")
    elif flock.get("ok") and fs.shared and fs.flock != "coherent":
        warnings.append("flock succeeds here but excludes only processes on the same node (it cannot be seen "
                        "from one node: run `srun -N 2 --ntasks-per-node=1 sharedfs doctor --cross-node PATH` to "
                        "check); tools that trust it (filelock, datasets, wids) can corrupt shared caches; "
                        f"sharedfs uses {uses}")
    if results.get("o_excl", {}).get("ok") is False:
        warnings.append("O_EXCL create is not exclusive here: existence (soft) locks are unsafe; use a lease "
                        "(SHAREDFS_LOCK=lease) or keep caches on node-local storage (SHAREDFS_CACHE=node-local)")
    if fs.kind == "unknown":
        warnings.append(f"unknown filesystem {fs.mount.fstype!r}: treated as shared with no trustworthy lock")
    return warnings


def _lock_words(state: str, errno_name: str | None, seen: dict[str, Any], shared: bool) -> str:
    """What one lock kind does here: what the probe saw, then what the classification knows."""
    if seen.get("errno"):
        return f"fails with {seen['errno']}"
    if seen.get("ok") is False:
        return "failed in the probe" + (f" ({seen.get('detail')})" if seen.get("detail") else "")
    if state == "absent":
        return f"fails{' with ' + errno_name if errno_name else ''}"
    if state == "node-local":
        return "works, but excludes only processes on the same node" if shared else "works"
    return "works and excludes across nodes" if shared else "works"


def sharedfs_off(current: Any) -> str | None:
    """Why sharedfs does nothing in this environment's programs (``SHAREDFS_DISABLE=1``), or None."""
    if "all" not in current.disable:
        return None
    from sharedfs.errors import ConfigError
    from sharedfs.model import envvars
    from sharedfs.model.settings import from_environ

    try:
        raw = from_environ(os.environ)[0].get("disable")  # quoted as the user wrote it
    except ConfigError:
        raw = None
    where = f"{envvars.DISABLE}={raw}" if raw is not None and current.source("disable") == envvars.DISABLE \
        else current.source("disable")
    return f"sharedfs is OFF here ({where}): programs use the frameworks' own locks"


def _doctor_verdict(path: str, fs: Any, probes: dict[str, Any], choice: Any, off: str | None = None) -> dict[str, str]:
    """The verdict a person can act on: what the filesystem is, what its locks do, what sharedfs does, what helps."""
    results = probes.get("results", {})
    mount = fs.mount
    what = (f"{filesystem_name(fs)} ({mount.fstype} mounted at {mount.mount_point}), "
            + ("shared between nodes" if fs.shared else "seen by this node only"))
    exclusive = results.get("o_excl", {}).get("ok", fs.o_excl_atomic)
    locks = (f"flock: {_lock_words(fs.flock, fs.flock_errno, results.get('flock', {}), fs.shared)}; "
             f"POSIX locks: {_lock_words(fs.posix, fs.posix_errno, results.get('posix', {}), fs.shared)}; "
             f"O_EXCL create: {'exclusive' if exclusive else 'NOT exclusive'}")
    across = ""
    if fs.shared:
        across = ("one node cannot see whether a lock excludes other nodes; check with "
                  f"`srun -N 2 --ntasks-per-node=1 sharedfs doctor --cross-node {path}`")
    names = {"flock": "flock", "posix": "POSIX (fcntl) locks", "soft": "existence (soft) locks",
             "lease": "leases (existence locks renewed while held)"}
    uses = f"{names.get(choice.kind, choice.kind)} ({choice.reason.rstrip('.')})"
    if choice.kind == "none":
        uses = f"NO lock: every lock taken here fails with NoSafeLockError ({choice.reason})"
    elif choice.kind in ("soft", "lease") or choice.marker:
        uses += "; each held lock is marked by <lock>.held with its holder's node, pid and Slurm job"
    if off:
        uses = f"nothing: OFF here (see `without it`); with SHAREDFS_DISABLE unset it would use {uses}"
    return {"filesystem": what, "locks": locks, "across_nodes": across, "sharedfs": uses,
            "without_sharedfs": _without_sharedfs(fs, choice), "better": _better(fs, results, choice)}


def _without_sharedfs(fs: Any, choice: Any) -> str:
    """Whether programs WITHOUT sharedfs (python -S, a colleague's venv, stock filelock) are excluded by its locks."""
    if choice.kind == "flock":
        return ("stock filelock (FileLock) takes flock on the same file, so programs without sharedfs and "
                "sharedfs exclude each other here")
    if choice.kind == "none":
        return ("stock filelock's flock here excludes only processes on the same node: programs without sharedfs "
                "can write one entry from two nodes at once")
    outsiders = "programs without sharedfs (a `python -S` tool, a venv without sharedfs, stock filelock)"
    if choice.kind == "posix":
        return (f"{outsiders} lock with flock, which on {KIND_NAMES.get(fs.kind, fs.kind)} does not exclude "
                "sharedfs's POSIX locks, nor they it: install sharedfs in every environment that uses this path")
    return (f"{outsiders} lock the lock file itself, not <lock>.held: they are NOT excluded by sharedfs's "
            "existence locks here, nor it by theirs; install sharedfs in every environment that uses this path")


def _better(fs: Any, results: dict[str, Any], choice: Any) -> str:
    """The one setting or mount option that would make this path better, or that nothing needs to change."""
    opts = fs.mount.options
    if fs.kind == "bucket":
        return ("keep locks and caches off this bucket mount: point the framework's cache variable at node-local "
                "storage or a shared POSIX filesystem (or set SHAREDFS_CACHE=node-local)")
    if results.get("o_excl", {}).get("ok") is False or not fs.o_excl_atomic:
        return ("O_CREAT|O_EXCL is not atomic here: set SHAREDFS_LOCK=lease, or keep caches on node-local storage "
                "(SHAREDFS_CACHE=node-local)")
    if not fs.shared:
        return "nothing: storage only this node sees; every lock kind works here"
    if fs.flock == "coherent":
        return "nothing: flock excludes across nodes here, for sharedfs and for every other program"
    if fs.kind == "lustre":
        was = "-o localflock" if "localflock" in opts else "no flock option"
        return (f"ask your admins to mount Lustre with `-o flock` (now: {was}); flock then excludes across nodes "
                "for every program, and sharedfs uses it too")
    if fs.kind == "nfs":
        if fs.flock_errno == "ENOLCK" or (results.get("flock", {}).get("errno") == "ENOLCK"):
            return ("start the NFS lock service on every client (rpc.statd and lockd, e.g. `systemctl start "
                    "rpc-statd`), or mount with NFSv4, whose locks are part of the protocol")
        if "local_lock" in opts:
            return (f"mount with `local_lock=none` (now: local_lock={opts.get('local_lock')}); locks then go to "
                    "the server and exclude across nodes")
        if "nolock" in opts:
            return "mount without `nolock`, so locks go to the server and exclude across nodes"
    if fs.kind == "gpfs":
        return ("nothing to remount: GPFS arbitrates POSIX locks across nodes and sharedfs uses them; its flock "
                "stays node-local, so install sharedfs wherever filelock is used on this path")
    if fs.kind == "beegfs":
        return ("set `tuneUseGlobalFileLocks=true` in beegfs-client.conf (ask your admins); then tell sharedfs "
                "with a site plugin, since the mount does not show it")
    if fs.kind == "moosefs" and fs.mount.client_options is not None:
        return ("remount without `mfsnobsdlocks` / `mfsnoposixlocks` (mfsmount's command line or mfsmount.cfg); "
                "MooseFS's own locks then exclude across nodes")
    if fs.kind == "cifs" and "nobrl" in opts:
        return "mount without `nobrl`, so POSIX locks go to the server"
    if choice.kind in ("soft", "lease"):
        return ("if this filesystem's locks are cluster-coherent, check it with `sharedfs doctor --cross-node` "
                "and then declare it in a site plugin (sharedfs_classify_filesystem) or set SHAREDFS_LOCK")
    return "nothing to change"


def conflict_lines(conflicts: dict[str, str]) -> list[str]:
    """Plain-language lines for :attr:`Policy.conflicts` (``sharedfs status`` and ``sharedfs doctor``)."""
    lines = []
    for name, text in sorted(conflicts.items()):
        lines.append(f"CONFLICT {name}: {text}.")
        if name == "node_id":
            lines.append("  sharedfs never uses this node id to declare a lock holder dead (it waits instead). "
                         "Unset SHAREDFS_NODE_ID in the job: exported in a batch script (as an old `eval "
                         "\"$(sharedfs env)\"` did), srun hands the batch node's name to every node.")
    return lines


def doctor_lines(report: dict[str, Any]) -> list[str]:
    """``sharedfs doctor``'s text for one path: the verdict first, the probes' evidence after it."""
    fs = report["filesystem"]
    verdict = report.get("verdict", {})
    options = fs["mount"].get("options") or {}
    shown = ",".join(key if value is None else f"{key}={value}" for key, value in options.items())
    lines = [report["path"],
             f"  filesystem : {verdict.get('filesystem', fs['kind'])}",
             f"  options    : {shown or '-'}",
             f"  locks      : {verdict.get('locks', '')}"]
    if report.get("sharedfs_off"):
        lines.insert(1, f"  OFF        : {report['sharedfs_off']}; unset SHAREDFS_DISABLE to turn it on")
    if verdict.get("across_nodes"):
        lines.append(f"  across     : {verdict['across_nodes']}")
    lines.append(f"  sharedfs   : {verdict.get('sharedfs', report['lock']['kind'])}")
    if report.get("handover"):
        lines.append(f"  handover   : {report['handover']}")
    if verdict.get("without_sharedfs"):
        lines.append(f"  without it : {verdict['without_sharedfs']}")
    lines.append(f"  better     : {verdict.get('better', '')}")
    lines.append(f"  cache      : {report['cache']['mode']} ({report['cache']['source']})")
    # Where people look first: the question after "what does this filesystem do" is "who holds what".
    lines.append(f"  held locks : `sharedfs locks {report['path']}` lists who holds each lock here (alive, dead, or "
                 "nobody here can tell); --clear-dead removes only those whose holder is provably gone")
    if report.get("team"):
        lines.extend(team_lines(report["team"], report["path"]))
    for name, result in report["probes"].get("results", {}).items():
        mark = "ok  " if result["ok"] else "FAIL"
        lines.append(f"  probe {name:<14} {mark} {result.get('detail', '')}")
    for note in fs["notes"]:
        lines.append(f"  note       : {note}")
    for warning in report["warnings"]:
        lines.append(f"  warning    : {warning}")
    for line in conflict_lines(report.get("conflicts", {})):
        lines.append(f"  {line}")
    return lines


def cmd_doctor(args: argparse.Namespace) -> int:
    if args.cross_node:
        return cmd_doctor_cross_node(args)
    reports, errors = [], []
    for path in args.paths:  # every usable path is reported, whatever is wrong with another one
        problem = doctor_path_problem(path)
        if problem:
            errors.append({"path": path, "error": problem})
            if not args.json:
                stderr_line(f"sharedfs doctor: {path + ': ' if path else ''}{problem}")
            continue
        report = doctor_report(path)
        reports.append(report)
        if not args.json:
            print("\n".join(doctor_lines(report)))
            print(flush=True)
    if args.json:
        print(json.dumps({"version": __version__, "paths": reports, "errors": errors}, indent=2))
        for error in errors:
            stderr_line(f"sharedfs doctor: {error['path'] + ': ' if error['path'] else ''}{error['error']}")
    return EXIT_USAGE if errors else EXIT_OK


def doctor_path_problem(path: str) -> str | None:
    """Why ``doctor`` cannot probe ``path`` (it probes directories: it creates its files there), or None."""
    if not path:  # never the current directory in its place: `sharedfs doctor "$CACHE"` with CACHE unset
        return "an empty PATH (an unset variable in a script?): name the directory to probe"
    if os.path.isdir(path):
        return None
    parent = nearest_directory(path)
    if os.path.lexists(path):
        return (f"not a directory: doctor probes the directory a file lives in (it creates its test files there); "
                f"run `sharedfs doctor {parent}`")
    return f"no such file or directory; the nearest directory that exists is {parent} (`sharedfs doctor {parent}`)"


def nearest_directory(path: str) -> str:
    """``path`` itself, or the nearest parent directory of it that exists (where a probe can run)."""
    current = os.path.abspath(path)
    while not os.path.isdir(current) and current != os.path.dirname(current):
        current = os.path.dirname(current)
    return current


def cmd_doctor_cross_node(args: argparse.Namespace) -> int:
    from sharedfs.commands.crossnode import CrossNodeError, format_report, run

    if len(args.paths) != 1:
        print("sharedfs doctor --cross-node: give exactly one shared directory", file=sys.stderr)
        return 2
    try:
        report = run(args.paths[0], timeout=args.timeout)
    except CrossNodeError as exc:
        print(f"sharedfs doctor --cross-node: {exc}", file=sys.stderr)
        return 2
    # One compact line per task: srun merges every task's output into one stream.
    print(json.dumps(report, sort_keys=True) if args.json else format_report(report), flush=True)
    return 0


def doctor_sections(paths: list[str]) -> list[tuple[str, list[str]]]:
    """``sharedfs doctor`` of ``paths`` as (path, text lines), for the demo's report; a failed probe says why."""
    sections = []
    for path in paths:
        problem = doctor_path_problem(path)
        if problem:
            sections.append((path, [f"could not probe: {problem}"]))
            continue
        try:
            report = doctor_report(path)
        except Exception as exc:  # noqa: BLE001 - the report must still be written
            sections.append((path, [f"could not probe: {type(exc).__name__}: {exc}"]))
            continue
        sections.append((report["path"], doctor_lines(report)[1:]))
    return sections

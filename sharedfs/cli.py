"""``sharedfs`` command line: ``status``, ``doctor``, ``env`` (each with ``--json``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import sysconfig
from typing import Any, Sequence

from . import __version__


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sharedfs", description=__doc__)
    parser.add_argument("--version", action="version", version=f"sharedfs {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p_status = sub.add_parser("status", help="version, autoload, shims, plugins and the policy with its sources")
    p_status.add_argument("--json", action="store_true", help="machine-readable output")
    p_status.set_defaults(func=cmd_status)

    p_doctor = sub.add_parser("doctor", help="probe paths: filesystem, locks, and what sharedfs will do there")
    p_doctor.add_argument("paths", nargs="*", default=["."], metavar="PATH")
    p_doctor.add_argument("--json", action="store_true", help="machine-readable output")
    p_doctor.add_argument("--cross-node", action="store_true",
                          help="probe PATH between nodes: run as one task per node (srun -N 2 --ntasks-per-node=1)")
    p_doctor.add_argument("--timeout", type=float, default=30.0, help="--cross-node: seconds to wait for other nodes")
    p_doctor.set_defaults(func=cmd_doctor)

    p_cleanup = sub.add_parser("cleanup", help="remove one job's node-local directories on this node (for epilogs)")
    p_cleanup.add_argument("--job", required=True, help="the job id (e.g. $SLURM_JOB_ID)")
    p_cleanup.add_argument("--uid", type=int, default=None, help="the job's user (default $SLURM_JOB_UID, else you)")
    p_cleanup.add_argument("--root", default=None, help="node-local root (default: the policy's)")
    p_cleanup.add_argument("--force", action="store_true", help="remove even while processes of the job use it")
    p_cleanup.add_argument("--json", action="store_true", help="machine-readable output")
    p_cleanup.set_defaults(func=cmd_cleanup)

    p_env = sub.add_parser("env", help="print the environment a batch script should export for this policy")
    p_env.add_argument("--shell", choices=("bash", "fish"), default="bash")
    p_env.add_argument("--json", action="store_true", help="machine-readable output")
    p_env.set_defaults(func=cmd_env)

    p_demo = sub.add_parser("demo", help="reproduce the cluster filesystem failures here, then fix them")
    p_demo.add_argument("--json", action="store_true", help="machine-readable output (progress goes to stderr)")
    p_demo.add_argument("--no-fuse", action="store_true", help="use the LD_PRELOAD fallback even if FUSE works")
    p_demo.add_argument("--only", action="append", metavar="TEXT", help="run the scenarios whose name contains TEXT")
    p_demo.set_defaults(func=cmd_demo)

    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


# -- status -------------------------------------------------------------------------------------


def status_report() -> dict[str, Any]:
    """Everything ``sharedfs status`` shows, as data."""
    from . import _bootstrap, activation, runtime
    from .errors import ConfigError

    report: dict[str, Any] = {
        "version": __version__,
        "python": sys.version.split()[0],
        "autoload": {
            "pth_file": _find_pth(),
            "active_in_this_interpreter": _bootstrap.installed(),
            "disabled_by_environment": _bootstrap.disabled_entirely(),
        },
        "config_error": None,
    }
    try:
        current = runtime.policy()
    except ConfigError as exc:
        report["config_error"] = str(exc)
        current = None
    report["policy"] = current.as_dict() if current else None
    report["conflicts"] = dict(current.conflicts) if current else {}
    shims = []
    for name, state in sorted(activation.shim_states().items()):
        shim = state.shim
        supported = activation.version_supported(state)
        shims.append({
            "name": name,
            "target": shim.target,
            "distribution": shim.distribution,
            "installed": state.installed_version,
            "supported_versions": shim.supported,
            "supported": supported if state.installed_version else None,
            "enabled": bool(current) and not current.shim_disabled(name),
            "applied": shim.applied,
            "patches": shim.patcher.changes(),
            "error": state.error,
        })
    blocked = sorted(runtime.registry().blocked)
    report["shims"] = shims
    report["blocked"] = blocked
    report["plugins"] = runtime.registry().plugin_names()
    report["external_plugins"] = [vars(p) for p in runtime.registry().external]
    return report


def _find_pth() -> str | None:
    for key in ("purelib", "platlib"):
        candidate = os.path.join(sysconfig.get_paths()[key], "sharedfs.pth")
        if os.path.exists(candidate):
            return candidate
    return None


def cmd_status(args: argparse.Namespace) -> int:
    report = status_report()
    if args.json:
        print(json.dumps(report, indent=2))
        return 1 if report["config_error"] else 0
    auto = report["autoload"]
    print(f"sharedfs {report['version']} (Python {report['python']})")
    if auto["disabled_by_environment"]:
        state = "disabled by SHAREDFS_DISABLE"
    elif auto["active_in_this_interpreter"]:
        state = "active"
    else:
        state = "not active in this interpreter (python -S, or not installed)"
    print(f"autoload: {auto['pth_file'] or 'no sharedfs.pth in site-packages'}; {state}")
    if report["config_error"]:
        print(f"\nCONFIG ERROR: {report['config_error']}")
    print("\nshims:")
    for shim in report["shims"]:
        if shim["installed"] is None:
            line = "not installed"
        else:
            fit = "supported" if shim["supported"] else f"UNSUPPORTED (needs {shim['supported_versions']})"
            line = f"{shim['distribution']} {shim['installed']} {fit}"
        flags = "enabled" if shim["enabled"] else "disabled"
        if shim["applied"]:
            flags += ", applied: " + ", ".join(shim["patches"])
        if shim["error"]:
            flags += f", ERROR: {shim['error']}"
        print(f"  {shim['name']:<16} {line}; {flags}")
    if report["external_plugins"]:
        print("\nthird-party plugins:")
        for plugin in report["external_plugins"]:
            state = f"FAILED: {plugin['error']}" if plugin["error"] else "loaded"
            print(f"  {plugin['name']:<16} {plugin['distribution']} {plugin['version']} ({plugin['value']}): {state}")
    if report["policy"]:
        print("\npolicy:")
        for name, item in report["policy"].items():
            print(f"  {name:<14} {item['value']!s:<24} ({item['source']})")
    return 1 if report["config_error"] else 0


# -- doctor -------------------------------------------------------------------------------------


#: What users see from their tools when a probe fails with this errno (datasets#6395, datasets#1672).
SYMPTOMS = {
    "ENOSYS": "filelock < 3.24 and datasets raise \"FileSystem does not appear to support flock\"",
    "ENOLCK": "filelock, datasets and wids raise \"[Errno 37] No locks available\" (no filelock release falls back)",
}


def doctor_report(path: str) -> dict[str, Any]:
    from . import choices, runtime
    from .probe import probe

    path = os.path.abspath(path)
    fs = choices.filesystem(path)
    current = runtime.policy()
    choice = choices.lock_choice(os.path.join(path, ".sharedfs-doctor.lock"), current)
    auto = choices.lock_choice(os.path.join(path, ".sharedfs-doctor.lock"), runtime.policy(lock="auto"))
    probes = probe(path)
    return {
        "path": path,
        "filesystem": {**fs.as_dict(), "safe_lock": auto.kind if auto.kind in ("flock", "posix") else None},
        "probes": probes,
        "lock": {"kind": choice.kind, "reason": choice.reason},
        "cache": {"mode": current.cache, "source": current.source("cache")},
        "warnings": _doctor_warnings(fs, probes, choice.kind),
    }


def _doctor_warnings(fs: Any, probes: dict[str, Any], lock_kind: str) -> list[str]:
    """Plain-language warnings from what the probes observed, then from what the classification knows."""
    warnings = []
    if not probes.get("writable", True):
        warnings.append(f"not writable here ({probes.get('error')}): sharedfs cannot place locks or caches here")
    results = probes.get("results", {})
    flock = results.get("flock", {})
    if flock.get("errno"):
        symptom = SYMPTOMS.get(flock["errno"], "tools that rely on flock fail here")
        warnings.append(f"flock fails here with {flock['errno']}: {symptom}; sharedfs uses a {lock_kind} lock")
    elif flock.get("ok") and fs.shared and fs.flock != "coherent":
        warnings.append("flock succeeds here but excludes only processes on the same node (it cannot be seen "
                        "from one node: run `srun -N 2 sharedfs doctor --cross-node PATH` to check); tools that "
                        f"trust it (filelock, datasets, wids) can corrupt shared caches; sharedfs uses a {lock_kind} lock")
    if results.get("o_excl", {}).get("ok") is False:
        warnings.append("O_EXCL create is not exclusive here: existence (soft) locks are unsafe; use a lease "
                        "(SHAREDFS_LOCK=lease) or keep caches on node-local storage (SHAREDFS_CACHE=node-local)")
    if fs.kind == "unknown":
        warnings.append(f"unknown filesystem {fs.mount.fstype!r}: treated as shared with no trustworthy lock")
    return warnings


def cmd_doctor(args: argparse.Namespace) -> int:
    if args.cross_node:
        return cmd_doctor_cross_node(args)
    reports = []
    for path in args.paths:
        if not os.path.exists(path):
            print(f"sharedfs doctor: {path}: no such file or directory", file=sys.stderr)
            return 2
        reports.append(doctor_report(path))
    if args.json:
        print(json.dumps({"version": __version__, "paths": reports}, indent=2))
        return 0
    for report in reports:
        fs = report["filesystem"]
        mount = fs["mount"]
        print(f"{report['path']}")
        print(f"  filesystem : {fs['kind']} ({mount['fstype']} at {mount['mount_point']}, "
              f"{'shared between nodes' if fs['shared'] else 'node-local'})")
        print(f"  options    : {mount.get('raw_options') or '-'}")
        print(f"  flock      : {fs['flock']}{' (' + fs['flock_errno'] + ')' if fs.get('flock_errno') else ''}; "
              f"POSIX locks: {fs['posix']}; O_EXCL atomic: {'yes' if fs['o_excl_atomic'] else 'no'}")
        for name, result in report["probes"].get("results", {}).items():
            mark = "ok  " if result["ok"] else "FAIL"
            print(f"  probe {name:<14} {mark} {result.get('detail', '')}")
        print(f"  lock       : {report['lock']['kind']} ({report['lock']['reason']})")
        print(f"  cache      : {report['cache']['mode']} ({report['cache']['source']})")
        for note in fs["notes"]:
            print(f"  note       : {note}")
        for warning in report["warnings"]:
            print(f"  warning    : {warning}")
        print()
    return 0


def cmd_doctor_cross_node(args: argparse.Namespace) -> int:
    from .crossnode import CrossNodeError, format_report, run

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


# -- cleanup ------------------------------------------------------------------------------------


def cmd_cleanup(args: argparse.Namespace) -> int:
    from .cleanup import JobCleanupError, cleanup_job

    try:
        report = cleanup_job(args.job, uid=args.uid, root=args.root, force=args.force)
    except JobCleanupError as exc:
        print(f"sharedfs cleanup: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for path in report["removed"]:
            print(f"removed {path}")
        if report["skipped"]:
            print(report["skipped"])
    return 1 if report["live"] and not report["removed"] else 0


# -- env ----------------------------------------------------------------------------------------


def env_exports() -> dict[str, str]:
    """The variables a batch script should export so that a process without autoload gets our layout."""
    from . import activation, choices, runtime
    from .settings import SETTINGS

    current = runtime.policy()
    exports: dict[str, str] = {}
    for setting in SETTINGS:
        if setting.name == "node_id":
            continue  # per process, never exported: `srun` would hand one node's name to every node
        value = getattr(current, setting.name)
        if current.source(setting.name) != "default" and value not in (None, ()):
            exports[setting.env] = _env_text(value)
    for state in activation.shim_states().values():
        placed = choices.cache_placement(state.shim, current)
        if placed is not None and placed.path:
            exports[state.shim.cache_env or ""] = placed.path
    return exports


def _env_text(value: Any) -> str:
    """A policy value as its environment variable spells it."""
    if isinstance(value, tuple):
        return ",".join(value)
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def cmd_env(args: argparse.Namespace) -> int:
    exports = env_exports()
    if args.json:
        print(json.dumps(exports, indent=2))
        return 0
    import shlex

    for key, value in exports.items():
        if args.shell == "fish":
            print(f"set -gx {key} {shlex.quote(value)};")
        else:
            print(f"export {key}={shlex.quote(value)}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import main as demo_main

    return demo_main(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

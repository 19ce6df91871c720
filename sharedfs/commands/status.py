"""``sharedfs status``: what sharedfs does in this environment (autoload, shims, caches, plugins, every setting)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import sysconfig
from typing import Any

from sharedfs import __version__
from sharedfs.commands.doctor import (
    conflict_lines,
    filesystem_name,
    handover_line,
    lock_choice_or_refusal,
    nearest_directory,
)
from sharedfs.commands.exits import EXIT_OK, EXIT_USAGE, error_line, stderr_line


def status_report(paths: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """Everything ``sharedfs status`` shows, as data; ``paths`` adds the filesystem each one is on."""

    import _sharedfs_bootstrap as _bootstrap
    from sharedfs.cluster.nodelocal import root_of
    from sharedfs.errors import ConfigError
    from sharedfs.machinery import runtime, standin
    from sharedfs.startup import activation
    from sharedfs.startup.onimport import FOLLOWERS, PENDING

    report: dict[str, Any] = {
        "version": __version__,
        "python": sys.version.split()[0],
        "platform": _platform(),
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
        report["config_error"] = error_line(exc)
        current = None
    unknown = runtime.unknown_disabled(current) if current is not None else None
    if unknown is not None:  # the policy stands (programs run with every shim it does not name on)
        report["config_error"] = error_line(unknown)
    report["policy"] = current.as_dict() if current else None
    report["conflicts"] = dict(current.conflicts) if current else {}
    root = root_of(current) if current else None
    report["node_local_root"] = {"path": root.path, "origin": root.origin} if root else None
    shims = []
    caches = []
    waiting = standin.waiting()  # taken first: loading every shim below does not activate them
    for name, state in sorted(activation.shim_states().items()):
        shim = state.shim
        supported = activation.version_supported(state)  # the one version gate, as on import
        installed = state.installed_version
        if current is not None and shim.cache_env and not current.shim_disabled(name):
            caches.append(_cache_row(name, shim, current))
        shims.append({
            "name": name,
            "target": shim.target,
            "distribution": shim.distribution,
            "installed": installed,
            "supported_versions": shim.supported,
            "supported": supported if installed else None,
            "enabled": None if current is None else not current.shim_disabled(name),
            "applied": shim.applied,
            "waiting_for_first_lock": name in waiting,
            "follower": name in FOLLOWERS,
            "pending": name in PENDING,
            "patches": shim.patcher.changes(),
            "error": state.error,
        })
    blocked = sorted(runtime.registry().blocked)
    report["libraries"] = _libraries(shims)
    in_use = [(cache["path"], f"{cache['name']} cache") for cache in caches]
    in_use += [(root.path, "node-local root")] if root else []
    report["mounts"] = _mounts([*in_use, (os.getcwd(), "current directory")])
    report["paths"] = [_path_row(path, current) for path in paths]
    report["shims"] = shims
    report["caches"] = caches
    from sharedfs.commands import placedcaches

    report["placed_caches"] = placedcaches.status_rows(current) if current is not None else []
    report["blocked"] = blocked
    report["plugins"] = runtime.registry().plugin_names()
    report["external_plugins"] = [vars(p) for p in runtime.registry().external]
    # What a bug report needs comes first (the text output leads with it too).
    first = ("version", "python", "platform", "libraries", "mounts")
    return {**{key: report[key] for key in first}, **{k: v for k, v in report.items() if k not in first}}


def _platform() -> dict[str, str]:
    """What a bug report needs to know about this machine (as ``hf env`` and ``accelerate env`` print it)."""
    import platform

    distro = "-"
    try:  # the OS's own name for itself; /etc/os-release is small and plain text
        with open("/etc/os-release", encoding="utf-8", errors="replace") as handle:
            for line in handle.read(65536).splitlines():
                if line.startswith("PRETTY_NAME="):
                    distro = line.partition("=")[2].strip().strip('"')
    except OSError:
        pass
    return {"os": distro, "system": platform.system(), "kernel": platform.release(), "machine": platform.machine(),
            "python_implementation": platform.python_implementation()}


#: sharedfs's own run-time dependencies: their versions decide what the frameworks' locks do (filelock).
RUNTIME_LIBRARIES = ("filelock", "pluggy", "packaging")


def _libraries(shims: list[dict[str, Any]]) -> dict[str, str | None]:
    """Installed versions: sharedfs's run-time dependencies, then every library a shim patches (None: absent)."""
    from sharedfs.startup import activation

    versions: dict[str, str | None] = {name: activation.installed_version(name) for name in RUNTIME_LIBRARIES}
    for shim in shims:
        if shim["distribution"]:
            versions.setdefault(shim["distribution"], shim["installed"])
    return versions


def _mounts(paths: list[tuple[str | None, str]]) -> list[dict[str, Any]]:
    """The filesystem under each path in use (caches, the node-local root, here), one row per path."""
    from sharedfs.machinery import choices

    rows: list[dict[str, Any]] = []
    for path, what in paths:
        if not path:
            continue
        try:
            fs = choices.filesystem(nearest_directory(os.path.expanduser(path)))
        except Exception as exc:  # noqa: BLE001 - a report for a bug report must not fail on one path
            rows.append({"path": path, "what": what, "error": f"{type(exc).__name__}: {exc}"})
            continue
        options = ",".join(key if value is None else f"{key}={value}" for key, value in fs.mount.options.items())
        rows.append({"path": path, "what": what, "kind": fs.kind, "name": filesystem_name(fs),
                     "fstype": fs.mount.fstype, "mount_point": fs.mount.mount_point, "options": options,
                     "shared": fs.shared})
    return rows


def _path_row(path: str, current: Any) -> dict[str, Any]:
    """``sharedfs status PATH``: the filesystem PATH is on, as doctor classifies it (nothing is probed), and the
    lock sharedfs takes there."""
    from sharedfs.machinery import choices

    where = nearest_directory(os.path.expanduser(path))
    try:
        fs = choices.filesystem(where)
    except Exception as exc:  # noqa: BLE001 - one unusable path must not hide the rest of the report
        return {"path": path, "error": f"{type(exc).__name__}: {exc}"}
    row: dict[str, Any] = {"path": path, "name": filesystem_name(fs), "filesystem": fs.as_dict(),
                           "handover": handover_line(fs)}
    if current is not None:
        choice = lock_choice_or_refusal(os.path.join(where, ".sharedfs-status.lock"), current)
        row["lock"] = {"kind": choice.kind, "reason": choice.reason, "marker": choice.marker}
    return row


def _cache_row(name: str, shim: Any, current: Any) -> dict[str, Any]:
    """Where one framework's cache goes in programs of this environment, and why (nothing is created here)."""
    from sharedfs.errors import SharedFSError
    from sharedfs.machinery import choices

    try:
        placed = choices.cache_placement(shim, current, create=False)
    except SharedFSError as exc:  # e.g. an unsafe node-local root: the framework's import would fail with it
        return {"name": name, "variable": shim.cache_env, "path": None, "reason": f"REFUSED: {exc}"}
    path = placed.path if placed is not None and placed.path else (
        os.environ.get(shim.cache_env) or shim.cache_default)
    return {"name": name, "variable": shim.cache_env, "path": path, "reason": placed.reason if placed else ""}


def _find_pth() -> str | None:
    for key in ("purelib", "platlib"):
        candidate = os.path.join(sysconfig.get_paths()[key], "sharedfs.pth")
        if os.path.exists(candidate):
            return candidate
    return None


def _shim_state(shim: dict[str, Any]) -> str:
    """What a shim does in programs of this environment, in a few words."""
    if shim["installed"] is None:
        return "-"
    if shim["error"]:
        return f"OFF after an internal error: {shim['error']}"
    if shim["enabled"] is None:  # no policy: a bad setting, which the framework's import raises too
        return f"import {shim['target']} fails with the CONFIG ERROR above"
    if not shim["enabled"]:
        return "OFF: SHAREDFS_DISABLE"
    if not shim["supported"]:
        return f"OFF: {shim['installed']} is outside {shim['supported_versions']}"
    if shim["applied"]:
        return "applied: " + ", ".join(shim["patches"])
    if shim.get("waiting_for_first_lock"):
        return "applies on its first lock (a stand-in holds the lock class's place until then)"
    if shim.get("pending"):
        return (f"applies on `import {shim['target']}` at the first error that could be a shared filesystem's lag "
                "(stdlib-only wrappers until then), or with any other shim")
    if shim.get("follower"):
        return (f"applies on `import {shim['target']}` once another shim is applied "
                "(that import alone loads nothing of sharedfs)")
    return f"applies on `import {shim['target']}`"


def cmd_status(args: argparse.Namespace) -> int:
    report = status_report(getattr(args, "paths", None) or ())
    if args.json:
        print(json.dumps(report, indent=2))
        return _status_config_error(report)
    auto = report["autoload"]
    system = report["platform"]
    print(f"sharedfs {report['version']} (Python {report['python']}; {system['system']} {system['kernel']} "
          f"{system['machine']}; {system['os']})")
    present = [f"{name} {version}" for name, version in report["libraries"].items() if version]
    absent = [name for name, version in report["libraries"].items() if not version]
    print(f"libraries: {', '.join(present)}" + (f" (not installed: {', '.join(absent)})" if absent else ""))
    print("mounts (of the paths in use):")
    grouped: dict[str, list[str]] = {}
    for row in report["mounts"]:
        where = row.get("error") or (f"{row['name']}, {row['fstype']} at {row['mount_point']} "
                                     f"({row['options'] or '-'}), "
                                     + ("shared between nodes" if row["shared"] else "this node only"))
        grouped.setdefault(where, []).append(f"{row['path']} ({row['what']})")
    for where, paths in grouped.items():
        print(f"  {where}: {', '.join(paths)}")
    for row in report["paths"]:
        print("\n".join(_path_lines(row)))
    if auto["disabled_by_environment"]:
        state = "disabled by SHAREDFS_DISABLE"
    elif auto["active_in_this_interpreter"]:
        state = "active in this interpreter"
    else:
        state = "NOT active in this interpreter (python -S, or sharedfs.pth is not in this environment)"
    print(f"autoload: {auto['pth_file'] or 'no sharedfs.pth in site-packages'}; {state}")
    if report["config_error"]:
        print(f"\nCONFIG ERROR: {report['config_error']}")
    if report["conflicts"]:
        print()
        for line in conflict_lines(report["conflicts"]):
            print(line)
    print("\nshims (each patches its framework in a program that imports it):")
    width = max([16, *(len(shim["name"]) for shim in report["shims"])])  # olmo_core.checkpoint is 20
    print(f"  {'name':<{width}} {'installed':<14} {'supported':<14} state")
    for shim in report["shims"]:
        print(f"  {shim['name']:<{width}} {shim['installed'] or 'not installed':<14} {shim['supported_versions']:<14} "
              f"{_shim_state(shim)}")
    if report["caches"]:
        print("\ncaches (where each framework's cache goes, and why):")
        for cache in report["caches"]:
            print(f"  {cache['name']:<16} {cache['variable']}={cache['path']}\n  {'':<16} {cache['reason']}")
    if report["placed_caches"]:
        from sharedfs.commands.placedcaches import status_lines

        print("\n" + "\n".join(status_lines(report["placed_caches"])))
    blocked = f"; blocked by the disable setting: {', '.join(report['blocked'])}" if report["blocked"] else ""
    external = {p["name"] for p in report["external_plugins"]}
    shim_names = {shim["name"] for shim in report["shims"]}
    builtin = [name for name in report["plugins"] if name not in external and name not in shim_names]
    print(f"\nplugins: {', '.join(builtin)}{blocked}")
    for plugin in report["external_plugins"]:
        state = f"FAILED: {plugin['error']}" if plugin["error"] else "loaded"
        print(f"  third-party {plugin['name']}: {plugin['distribution']} {plugin['version']} ({plugin['value']}): "
              f"{state}")
    if report["policy"]:
        print("\npolicy (value, and where it came from):")
        for name, item in report["policy"].items():
            value, source = item["value"], item["source"]
            if name == "cache_root" and value is None and report["node_local_root"]:
                root = report["node_local_root"]
                value = root["path"]
                source = ("default: $SLURM_TMPDIR, $TMPDIR unset" if root["origin"] == "the default node-local root"
                          else f"default: ${root['origin']}")
            if name == "disable":
                value = ", ".join(value) or "-"
            flag = "  <- CONFLICT" if name in report["conflicts"] else ""
            print(f"  {name:<14} {value!s:<24} ({source}){flag}")
    return _status_config_error(report)


def _path_lines(row: dict[str, Any]) -> list[str]:
    """A PATH given to ``status``: its filesystem by name, what its locks do, the lock sharedfs takes there."""
    if "error" in row:
        return [f"{row['path']}: {row['error']}"]
    fs = row["filesystem"]
    mount = fs["mount"]
    lines = [f"{row['path']}: {row['name']} ({mount['fstype']} at {mount['mount_point']}), "
             + ("shared between nodes" if fs["shared"] else "this node only"),
             f"  locks      : flock {fs['flock']}, POSIX locks {fs['posix']}, O_EXCL create "
             + ("atomic" if fs["o_excl_atomic"] else "NOT atomic")
             + ("" if fs["hard_links"] is None else ", hard links " + ("yes" if fs["hard_links"] else "none"))]
    if "lock" in row:
        kind = "NO lock (every lock taken here fails with NoSafeLockError)" if row["lock"]["kind"] == "none" \
            else row["lock"]["kind"]
        lines.append(f"  sharedfs   : {kind} ({row['lock']['reason']})")
    if row.get("handover"):
        lines.append(f"  handover   : {row['handover']}")
    lines.extend(f"  note       : {note}" for note in fs["notes"])
    return lines


def _status_config_error(report: dict[str, Any]) -> int:
    """``status`` shows what it can under a bad setting, then says it on stderr as every command does."""
    if not report["config_error"]:
        return EXIT_OK
    sys.stdout.flush()  # the report first, then the line (a terminal shows them in that order)
    stderr_line(f"sharedfs status: {report['config_error']}")
    return EXIT_USAGE

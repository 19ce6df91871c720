"""The ``sharedfs`` command: ``status``, ``doctor``, ``locks``, ``env``, ``cleanup``, ``demo`` (all with ``--json``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import sysconfig
from collections.abc import Callable, Sequence
from typing import Any

from sharedfs import __version__
from sharedfs.model.records import group_name, user_name

DESCRIPTION = """\
sharedfs makes ML frameworks' locks and caches correct on cluster shared filesystems
(Lustre, GPFS, NFS, BeeGFS, CephFS).  Installed, it works without a command: every
Python process picks it up.  These commands show what it does and check your cluster."""

EPILOG = """\
examples:
  sharedfs status                         is autoload active, which shims apply, every setting and its source
  sharedfs doctor /lustre/proj/cache      what this path's filesystem and locks do, and what would make them better
  srun -N 2 --ntasks-per-node=1 sharedfs doctor --cross-node /lustre/proj/cache
                                          check from two nodes whether locks really exclude across nodes
  sharedfs locks /lustre/proj/cache       who holds each lock there (alive, dead, or nobody here can tell)
  sharedfs locks --clear-dead /lustre/proj/cache
                                          remove exactly the locks whose holder is provably gone
  exports="$(sharedfs env)"; eval "$exports"
                                          in a batch script whose Python runs without site (python -S)
  sharedfs cleanup --job "$SLURM_JOB_ID" --uid "$SLURM_JOB_UID"
                                          in a Slurm epilog: remove the job's node-local caches
  sharedfs demo --html report.html        reproduce the cluster failures here, fixed; a report for your admins

Each command has --help.  Settings are SHAREDFS_* variables (see `sharedfs status`).
"""


#: ``sharedfs env --shell``: every POSIX shell takes ``export NAME='value'``; fish takes ``set -gx``.
SHELLS = ("bash", "sh", "zsh", "fish")

#: What ``--json`` says in every command's help (``demo`` adds where its progress goes).
JSON_HELP = "machine-readable output"


def _command(sub: Any, name: str, func: Callable[[argparse.Namespace], int], help: str,
             description: str) -> argparse.ArgumentParser:
    """One subcommand: its one-line ``help`` in ``sharedfs --help``, its ``description``, and what runs it."""
    command: argparse.ArgumentParser = sub.add_parser(name, help=help, description=description)
    command.set_defaults(func=func)
    return command


def _json_flag(command: argparse.ArgumentParser, help: str = JSON_HELP) -> None:
    """``--json``, added where it stands in the command's option list (the help shows options in that order)."""
    command.add_argument("--json", action="store_true", help=help)


def build_parser() -> argparse.ArgumentParser:
    """The command line, as data (the tests compare it with the README and the docs)."""
    parser = argparse.ArgumentParser(prog="sharedfs", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"sharedfs {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                title="commands (sharedfs COMMAND --help for each)")

    status = _command(sub, "status", cmd_status,
                      help="version, autoload, shims, plugins, policy conflicts, every setting with its source",
                      description="What sharedfs does in this environment.")
    _json_flag(status)

    doctor = _command(
        sub, "doctor", cmd_doctor,
        help="what a path's filesystem and locks do, what sharedfs does there, what would make it better",
        description="Probe each PATH (files are created in a temporary subdirectory and removed): what the "
                    "filesystem is, what its locks really do, which lock sharedfs uses there, whether programs "
                    "without sharedfs are excluded by it, and the one setting or mount option that would help.")
    doctor.add_argument("paths", nargs="*", default=["."], metavar="PATH",
                        help="directories to probe, e.g. your datasets cache (default: the current directory)")
    _json_flag(doctor)
    doctor.add_argument("--cross-node", action="store_true",
                        help="probe PATH between nodes: run as one task per node (srun -N 2 --ntasks-per-node=1)")
    doctor.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                        help="--cross-node: seconds to wait for the other nodes (default 30)")

    locks = _command(
        sub, "locks", cmd_locks,
        help="which locks exist under a path, who holds each, whether that holder is alive, dead or unknown",
        description="Walk each PATH (a cache directory, or one lock file) and list every lock sharedfs and the "
                    "frameworks use there: the holder (user, node, pid, Slurm job and step, since when) and its "
                    "state: held, dead (provably gone: this node's own evidence, or Slurm says the job or step "
                    "ended), unknown (nobody here can tell: another node and no scheduler to ask), or free. "
                    "Exit status: 0 nothing held, 1 something held or unknown, 2 an error.")
    locks.add_argument("paths", nargs="+", metavar="PATH",
                       help="cache directories to walk, or lock files (the path a wait message names)")
    _json_flag(locks, JSON_HELP + ": a list of objects with lock, kind, state, holder, evidence")
    locks.add_argument("--clear-dead", action="store_true",
                       help="remove the locks whose state is dead, by the lock's own breaking protocol (a holder "
                            "that takes the lock meanwhile keeps it); unknown ones are never removed")
    locks.add_argument("--older-than", type=float, default=None, metavar="SECONDS",
                       help="only locks held (or left) for at least SECONDS")
    locks.add_argument("--user", default=None, metavar="NAME", help="only locks of this user (name or uid)")

    env = _command(
        sub, "env", cmd_env,
        help="print the exports a batch script needs when its Python cannot autoload (python -S)",
        description="Print the variables that give a process without autoload (python -S, a wrapper that "
                    "clears site) the same policy and cache directories.  The node id is never exported: it "
                    "is per process, and `srun` would hand the batch node's name to every node.")
    env.add_argument("--shell", choices=SHELLS, default="bash",
                     help="syntax of the exports: bash, sh and zsh share one (export NAME=value), fish has its "
                          "own (default bash)")
    _json_flag(env)

    cleanup = _command(
        sub, "cleanup", cmd_cleanup,
        help="remove one job's node-local directories on this node (for Slurm epilogs)",
        description="Remove <root>/sharedfs-<uid>/job-<ID>/ on this node, as that user; refused while the "
                    "job's processes still use it (unless --force).")
    cleanup.add_argument("--job", required=True, metavar="ID", help="the job id (e.g. $SLURM_JOB_ID)")
    cleanup.add_argument("--uid", type=int, default=None, metavar="UID",
                         help="the job's user (default $SLURM_JOB_UID, else you)")
    cleanup.add_argument("--root", default=None, metavar="DIR", help="node-local root (default: the policy's)")
    cleanup.add_argument("--force", action="store_true", help="remove even while processes of the job use it")
    _json_flag(cleanup)

    demo = _command(
        sub, "demo", cmd_demo,
        help="reproduce the cluster filesystem failures on this machine, then show them fixed",
        description="Run each field failure twice in real processes on a simulated cluster filesystem: "
                    "without sharedfs, then with it.  Scenarios whose framework is not installed are skipped "
                    "with the command that installs it (in a clone, pip install '.[demo]' brings them all).")
    _json_flag(demo, JSON_HELP + " (progress goes to stderr)")
    demo.add_argument("--no-fuse", action="store_true", help="use the LD_PRELOAD fallback even if FUSE works")
    demo.add_argument("--only", action="append", metavar="TEXT",
                      help="run the scenarios whose name contains TEXT (repeatable)")
    demo.add_argument("--html", metavar="FILE", help="also write a one-page HTML report (for a ticket)")
    demo.add_argument("--markdown", metavar="FILE", help="also write the report as Markdown")
    demo.add_argument("--doctor", action="append", metavar="PATH",
                      help="paths whose `sharedfs doctor` verdict goes into the report (default: the current "
                           "directory; repeatable)")
    return parser


#: Exit statuses every command shares (``sharedfs COMMAND --help`` and docs/cli.md say which others it has).
EXIT_OK = 0
#: A bad setting (``SHAREDFS_*``, the ``SHAREDFS_CONFIG`` file), a bad argument, a path that cannot be used.
EXIT_USAGE = 2
#: stdout was closed before everything was written (``sharedfs status | head -1``), as a shell
#: reports a program ended by SIGPIPE (128 + 13); nothing is printed about it.
EXIT_PIPE = 141
#: Interrupted (Ctrl-C), as a shell reports a program ended by SIGINT (128 + 2).
EXIT_INTERRUPTED = 130
#: Commands that report a bad setting themselves, with everything else they can show.
REPORTS_CONFIG_ERROR = ("status",)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; a bad setting or path ends in one line on stderr, never a traceback."""
    parser = build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
    _suggest_command(parser, words)
    args = argparse.Namespace(command=None)
    try:
        args = parser.parse_args(words)  # --help and --version print here: a closed pipe too
        if args.command not in REPORTS_CONFIG_ERROR:
            _check_settings()
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # inside the try: a closed pipe shows up here, not as a traceback at exit
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_PIPE
    except KeyboardInterrupt:  # Ctrl-C during a probe, a walk or a wait for other nodes
        _stderr(f"sharedfs {args.command or ''}: interrupted".replace(" :", ":"))
        return EXIT_INTERRUPTED
    except SystemExit:  # argparse after --help, --version or a usage error: its output is still buffered
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            _silence_stdout()
            return EXIT_PIPE
        raise
    except Exception as exc:  # noqa: BLE001 - only what error_line() knows; anything else is a bug: re-raised
        line = error_line(exc)
        if line is None:
            raise
        _stderr(f"sharedfs {args.command}: {line}")
        return EXIT_USAGE
    return code


def error_line(exc: BaseException) -> str | None:
    """One line for an error that is the user's situation (a setting, a path), or None for a bug of ours."""
    from sharedfs.errors import ConfigError, SharedFSError

    text = " ".join(str(exc).split())  # one line, whatever the message's own line breaks
    if isinstance(exc, ConfigError):
        return f"{text}; {setting_fix(exc.origin)}"
    if isinstance(exc, SharedFSError):
        return text
    if isinstance(exc, OSError):
        return text or type(exc).__name__
    return None


def setting_fix(origin: str) -> str:
    """What to do about a bad setting, given where it was read (a variable, or ``FILE: key``)."""
    if origin.startswith("SHAREDFS_"):
        return f"fix or unset {origin} (docs/settings.md lists every setting)"
    file, _, key = origin.rpartition(": ")
    if file:
        return f"fix or remove `{key}` in {file} (the file SHAREDFS_CONFIG names; docs/settings.md)"
    return f"fix {origin} (docs/settings.md lists every setting)"


def _check_settings() -> None:
    """Resolve the settings as a framework's import would: a bad one is refused before the command runs."""
    from sharedfs.machinery import runtime

    unknown = runtime.unknown_disabled(runtime.policy())
    if unknown is not None:  # a program would go on with every shim on; a command says it is wrong
        raise unknown


def _stderr(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:  # stderr closed too: nothing left to tell
        pass


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not raise again (Python's docs' recipe)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def _suggest_command(parser: argparse.ArgumentParser, words: list[str]) -> None:
    """``sharedfs stauts``: argparse's "invalid choice", plus the command meant (as pip and git say)."""
    import difflib

    word = next((w for w in words if not w.startswith("-")), None)
    names = list(_subcommands(parser))
    if word is None or word in names:
        return
    close = difflib.get_close_matches(word, names, n=1, cutoff=0.6)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    parser.error(f"unknown command '{word}'{hint}; the commands: {', '.join(names)}")


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


# -- status -------------------------------------------------------------------------------------


def status_report() -> dict[str, Any]:
    """Everything ``sharedfs status`` shows, as data."""

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
        rows.append({"path": path, "what": what, "kind": fs.kind, "fstype": fs.mount.fstype,
                     "mount_point": fs.mount.mount_point, "options": options, "shared": fs.shared})
    return rows


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
        return f"applies on `import {shim['target']}` once another shim is applied (it acts on what they claim)"
    return f"applies on `import {shim['target']}`"


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


def cmd_status(args: argparse.Namespace) -> int:
    report = status_report()
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
        where = row.get("error") or (f"{row['fstype']} at {row['mount_point']} ({row['options'] or '-'}), "
                                     + ("shared between nodes" if row["shared"] else "this node only"))
        grouped.setdefault(where, []).append(f"{row['path']} ({row['what']})")
    for where, paths in grouped.items():
        print(f"  {where}: {', '.join(paths)}")
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
    blocked = f"; blocked by SHAREDFS_DISABLE: {', '.join(report['blocked'])}" if report["blocked"] else ""
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


def _status_config_error(report: dict[str, Any]) -> int:
    """``status`` shows what it can under a bad setting, then says it on stderr as every command does."""
    if not report["config_error"]:
        return EXIT_OK
    sys.stdout.flush()  # the report first, then the line (a terminal shows them in that order)
    _stderr(f"sharedfs status: {report['config_error']}")
    return EXIT_USAGE


# -- doctor -------------------------------------------------------------------------------------


#: What users see from their tools when a probe fails with this errno (datasets#6395, datasets#1672).
SYMPTOMS = {
    "ENOSYS": "filelock < 3.24 and datasets raise \"FileSystem does not appear to support flock\"",
    "ENOLCK": "filelock, datasets and wids raise \"[Errno 37] No locks available\" (no filelock release falls back)",
}

#: Human names of the filesystem kinds ``sharedfs_classify_filesystem`` answers.
KIND_NAMES = {
    "lustre": "Lustre", "gpfs": "GPFS (IBM Storage Scale)", "nfs": "NFS", "beegfs": "BeeGFS", "cephfs": "CephFS",
    "cifs": "SMB/CIFS", "fuse": "a FUSE filesystem", "overlay": "an overlay filesystem (container layers)",
    "tmpfs": "tmpfs (memory)", "local": "a local disk", "unknown": "an unknown filesystem",
}


def doctor_report(path: str) -> dict[str, Any]:
    from sharedfs.commands.probe import probe
    from sharedfs.machinery import choices, runtime

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
        "lock": {"kind": choice.kind, "reason": choice.reason, "marker": choice.marker},
        "cache": {"mode": current.cache, "source": current.source("cache")},
        "warnings": _doctor_warnings(fs, probes, choice.kind),
        "verdict": _doctor_verdict(path, fs, probes, choice, off=sharedfs_off(current)),
        "sharedfs_off": sharedfs_off(current),
        "conflicts": dict(current.conflicts),
        "team": team_check(path, current),
    }


# -- doctor: team caches --------------------------------------------------------------------------

#: At most this many entries are looked at (a hub cache can hold millions); the report says when it stopped.
TEAM_SCAN_LIMIT = 20_000
#: Examples shown per kind of problem.
TEAM_EXAMPLES = 3


def team_check(path: str, policy: Any, limit: int = TEAM_SCAN_LIMIT) -> dict[str, Any]:
    """Whether ``path`` is a cache a group of users shares, and which entries keep members out.

    A team cache (``sharedfs_team_cache``: setgid and group-writable, a default ACL for a
    group, or ``SHAREDFS_SHARED_GROUP``) needs every entry in the team's group, directories
    the group may enter and add to (and setgid, so new entries stay the group's), files the
    group may read, and lock files the group may open for writing (stock filelock and POSIX
    locks need that; sharedfs waits on a flock read-only).  A directory that is no team cache
    but holds entries of several users, or is group-writable, is one that people share
    without saying so.
    """
    import pwd
    import stat as st_

    from sharedfs.cluster import teamfiles
    from sharedfs.machinery import choices
    top = os.stat(path)
    error: str | None = None
    try:
        team = choices.team_cache(path, policy)
    except Exception as exc:  # noqa: BLE001 - e.g. SHAREDFS_SHARED_GROUP names a group this user is not in
        team, error = None, str(exc)
    gid = team.gid if team is not None else top.st_gid
    group = group_name(gid)
    acl = teamfiles.default_acl_group(path)
    setgid_mode = team is not None and bool(top.st_mode & st_.S_ISGID)
    owners: dict[int, int] = {}
    problems: dict[str, list[tuple[str, int, int]]] = {
        "wrong_group": [], "closed_dirs": [], "no_setgid": [], "unreadable": [], "unlockable": []}
    scanned, truncated = 0, False

    def look(entry_path: str, entry: os.stat_result) -> None:
        owners[entry.st_uid] = owners.get(entry.st_uid, 0) + 1
        if st_.S_ISLNK(entry.st_mode):
            return  # a link's own mode and group mean nothing
        mode, seen = st_.S_IMODE(entry.st_mode), (entry_path, entry.st_uid, st_.S_IMODE(entry.st_mode))
        if entry.st_gid != gid:
            problems["wrong_group"].append(seen)
        if st_.S_ISDIR(entry.st_mode):
            if mode & 0o070 != 0o070:
                problems["closed_dirs"].append(seen)
            if setgid_mode and not mode & st_.S_ISGID:
                problems["no_setgid"].append(seen)
        elif st_.S_ISREG(entry.st_mode):
            if not mode & st_.S_IRGRP:
                problems["unreadable"].append(seen)
            elif entry_path.endswith(".lock") and not mode & st_.S_IWGRP:
                problems["unlockable"].append(seen)

    look(path, os.lstat(path))
    for dirpath, dirnames, filenames in os.walk(path):
        for name in (*dirnames, *filenames):
            if scanned >= limit:
                truncated = True
                break
            entry_path = os.path.join(dirpath, name)
            try:
                entry = os.lstat(entry_path)
            except OSError:
                continue
            scanned += 1
            look(entry_path, entry)
        if truncated:
            break
    users = {user_name(uid): count for uid, count in sorted(owners.items(), key=lambda item: -item[1])}
    shared = team is not None or len(owners) > 1 or bool(top.st_mode & st_.S_IWGRP)
    not_candidate = None
    if shared:
        candidate_gid, not_candidate = _team_candidate(top, owners, gid, team is not None, pwd)
        group = group_name(candidate_gid) if candidate_gid is not None else "<your-team-group>"
    counts = {name: len(found) for name, found in problems.items()}
    if team is None:
        # Nothing is the group's by rule here: the problems only count once people share the directory.
        counts = dict.fromkeys(counts, 0) if not shared else counts
    return {
        "team": team is not None,
        "reason": team.reason if team is not None else error,
        "group": group,
        "gid": gid,
        "setgid": bool(top.st_mode & st_.S_ISGID),
        "default_acl_group": group_name(acl) if acl is not None else None,
        "shared": shared,
        "scanned": scanned + 1,
        "truncated": truncated,
        "owners": users,
        "problems": counts,
        "examples": {name: [{"path": p, "owner": user_name(uid), "mode": f"{mode:o}"}
                            for p, uid, mode in found[:TEAM_EXAMPLES]]
                     for name, found in problems.items() if found and counts[name]},
        "candidate": not_candidate is None,
        "not_candidate": not_candidate,
        "fix": [] if not_candidate else _team_fix(path, group, counts, bool(top.st_mode & st_.S_ISGID), acl is not None,
                                                  team is not None, shared),
    }


def _team_candidate(top: os.stat_result, owners: dict[int, int], gid: int, team: bool,
                    pwd: Any) -> tuple[int | None, str | None]:
    """The group a shared tree could become a team cache of, or why it is not a candidate at all.

    A recursive chgrp/chmod is advice only for a tree whose entries already belong to members of
    one group: on ``/tmp`` (sticky, world-writable, every user's files) it would make every
    user's files writable by one group.  root's entries do not count (the administrator's).
    """
    import stat as st_

    if top.st_mode & st_.S_ISVTX or top.st_mode & st_.S_IWOTH:
        what = " and ".join(word for word, bit in (("sticky", st_.S_ISVTX), ("world-writable", st_.S_IWOTH))
                            if top.st_mode & bit)
        return None, (f"it is {what}: a directory every user of this machine writes into (like /tmp), not one "
                      "group's")
    people = [uid for uid in owners if uid != 0]
    common: set[int] | None = None
    for uid in people:
        try:
            entry = pwd.getpwuid(uid)
            groups = set(os.getgrouplist(entry.pw_name, entry.pw_gid))
        except (KeyError, OSError):
            groups = set()
        common = groups if common is None else common & groups
    if common is None:  # only root's entries
        return (None if gid == 0 else gid), None
    if team and gid not in common:
        outside = [user_name(uid) for uid in people if not _member(uid, gid, pwd)]
        return None, f"entries of users outside group {group_name(gid)} ({', '.join(outside)})"
    if gid in common and gid != _private_gid(top.st_uid, pwd):
        return gid, None
    private = {_private_gid(uid, pwd) for uid in people}
    shared_groups = sorted(common - private)
    if len(people) == 1:
        return (shared_groups[0] if len(shared_groups) == 1 else None), None  # one owner: name her team's group
    if not shared_groups:
        names = ", ".join(user_name(uid) for uid in people)
        return None, f"entries of users who share no group ({names})"
    return shared_groups[0] if len(shared_groups) == 1 else None, None


def _member(uid: int, gid: int, pwd: Any) -> bool:
    try:
        entry = pwd.getpwuid(uid)
        return gid in os.getgrouplist(entry.pw_name, entry.pw_gid)
    except (KeyError, OSError):
        return False


def _private_gid(uid: int, pwd: Any) -> int | None:
    try:
        return int(pwd.getpwuid(uid).pw_gid)
    except KeyError:
        return None


def _team_fix(path: str, group: str, counts: dict[str, int], setgid: bool, acl: bool, team: bool,
              shared: bool) -> list[str]:
    """The one-time commands (for root, or each owner on her own entries) that make ``path`` a sound team cache."""
    if not shared:
        return []
    import shlex

    quoted = shlex.quote(path)
    fix = []
    if counts["wrong_group"] or not team:
        fix.append(f"chgrp -R {group} {quoted}")
    if counts["closed_dirs"] or counts["unreadable"] or counts["unlockable"] or not team:
        fix.append(f"chmod -R g+rwX {quoted}")
    if counts["no_setgid"] or not setgid:
        fix.append(f"find {quoted} -type d -exec chmod g+s {{}} +")
    if not acl:
        # New entries then get group rw whatever each user's umask, in programs without sharedfs too.
        fix.append(f"setfacl -R -d -m g:{group}:rwX {quoted}")
    return fix


_TEAM_WORDS = {
    "wrong_group": "not in group {group} (members may have no access at all)",
    "closed_dirs": "directories the group cannot enter or add to (no g+rwx): a member's new dataset, blob or "
                   "shard fails with PermissionError there",
    "no_setgid": "directories without setgid: what is made in them gets the creator's group, not {group}",
    "unreadable": "files the group cannot read",
    "unlockable": "lock files the group cannot open for writing: stock filelock (datasets, the hub without "
                  "sharedfs) fails with PermissionError on them; sharedfs waits on them read-only",
}


def team_lines(team: dict[str, Any], path: str) -> list[str]:
    """``sharedfs doctor``'s lines about who shares ``path`` and whether every member can use it."""
    owners = ", ".join(f"{name} ({count})" for name, count in team["owners"].items())
    checked = f"{team['scanned']}{'+ (stopped there)' if team['truncated'] else ''} entries of {owners}"
    bad = sum(team["problems"].values())
    if team["team"]:
        head = f"a team cache of group {team['group']} ({team['reason']})"
        lines = [f"  team       : {head}; {checked}: " + (
            "every member can read, lock and add to them" if not bad else f"{bad} keep other members out")]
    elif team["shared"] and team.get("not_candidate"):
        return [f"  team       : NOT a team cache, and not a candidate for one: {team['not_candidate']}; {checked}. "
                "No permission change is suggested (a recursive chgrp/chmod here would open other users' files to "
                "one group). For a team cache, make a directory of its own: mkdir DIR; chgrp <your-team-group> DIR; "
                "chmod 2770 DIR"]
    elif team["shared"]:
        lines = [f"  team       : NOT a team cache (neither setgid and group-writable, nor a default ACL for a "
                 f"group, nor SHAREDFS_SHARED_GROUP), yet shared: {checked}"
                 + (f"; {team['reason']}" if team["reason"] else "")
                 + ". What one user's umask makes here keeps the others out; make it a team cache once:"]
    else:
        return [f"  team       : private to {owners.split(' (')[0] or 'its owner'} (no group shares it)"]
    for name, count in team["problems"].items():
        if count:
            examples = "; ".join(f"{e['path']} ({e['owner']}, {e['mode']})" for e in team["examples"].get(name, []))
            lines.append(f"  team issue : {count} {_TEAM_WORDS[name].format(group=team['group'])}, e.g. {examples}")
    if team["fix"]:
        who = "as root, or each owner on her own entries" if len(team["owners"]) > 1 else "once"
        lines.append(f"  team fix   : run {who}:")
        lines.extend(f"               {command}" for command in team["fix"])
    return lines


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
                        "from one node: run `srun -N 2 --ntasks-per-node=1 sharedfs doctor --cross-node PATH` to "
                        "check); tools that trust it (filelock, datasets, wids) can corrupt shared caches; "
                        f"sharedfs uses a {lock_kind} lock")
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
    import _sharedfs_bootstrap as _bootstrap

    raw = os.environ.get(_bootstrap.DISABLE)
    where = f"SHAREDFS_DISABLE={raw}" if raw is not None and current.source("disable") == _bootstrap.DISABLE \
        else current.source("disable")
    return f"sharedfs is OFF here ({where}): programs use the frameworks' own locks"


def _doctor_verdict(path: str, fs: Any, probes: dict[str, Any], choice: Any, off: str | None = None) -> dict[str, str]:
    """The verdict a person can act on: what the filesystem is, what its locks do, what sharedfs does, what helps."""
    results = probes.get("results", {})
    mount = fs.mount
    what = (f"{KIND_NAMES.get(fs.kind, fs.kind)} ({mount.fstype} mounted at {mount.mount_point}), "
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
    if choice.kind in ("soft", "lease") or choice.marker:
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
    outsiders = "programs without sharedfs (a `python -S` tool, a venv without sharedfs, stock filelock)"
    if choice.kind == "posix":
        return (f"{outsiders} lock with flock, which on {KIND_NAMES.get(fs.kind, fs.kind)} does not exclude "
                "sharedfs's POSIX locks, nor they it: install sharedfs in every environment that uses this path")
    return (f"{outsiders} lock the lock file itself, not <lock>.held: they are NOT excluded by sharedfs's "
            "existence locks here, nor it by theirs; install sharedfs in every environment that uses this path")


def _better(fs: Any, results: dict[str, Any], choice: Any) -> str:
    """The one setting or mount option that would make this path better, or that nothing needs to change."""
    opts = fs.mount.options
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
    if fs.kind == "cifs" and "nobrl" in opts:
        return "mount without `nobrl`, so POSIX locks go to the server"
    if choice.kind in ("soft", "lease"):
        return ("if this filesystem's locks are cluster-coherent, check it with `sharedfs doctor --cross-node` "
                "and then declare it in a site plugin (sharedfs_classify_filesystem) or set SHAREDFS_LOCK")
    return "nothing to change"


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
                _stderr(f"sharedfs doctor: {path + ': ' if path else ''}{problem}")
            continue
        report = doctor_report(path)
        reports.append(report)
        if not args.json:
            print("\n".join(doctor_lines(report)))
            print(flush=True)
    if args.json:
        print(json.dumps({"version": __version__, "paths": reports, "errors": errors}, indent=2))
        for error in errors:
            _stderr(f"sharedfs doctor: {error['path'] + ': ' if error['path'] else ''}{error['error']}")
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


# -- locks --------------------------------------------------------------------------------------


def cmd_locks(args: argparse.Namespace) -> int:
    from sharedfs.commands.locks import main as locks_main

    return locks_main(args.paths, as_json=args.json, clear_dead=args.clear_dead, older_than=args.older_than,
                      user=args.user)


# -- cleanup ------------------------------------------------------------------------------------


def cmd_cleanup(args: argparse.Namespace) -> int:
    from sharedfs.cluster.cleanup import JobCleanupError, cleanup_job

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
    from sharedfs.machinery import choices, runtime
    from sharedfs.model.settings import SETTINGS
    from sharedfs.startup import activation

    current = runtime.policy()
    exports: dict[str, str] = {}
    for setting in SETTINGS:
        if setting.name == "node_id":
            continue  # per process, never exported: `srun` would hand one node's name to every node
        value = getattr(current, setting.name)
        if current.source(setting.name) != "default" and value not in (None, ()):
            exports[setting.env] = _env_text(value)
    for state in activation.shim_states().values():
        placed = choices.cache_placement(state.shim, current, create=False)
        if placed is not None and placed.path:
            exports[state.shim.cache_env or ""] = placed.path
    from sharedfs.commands.placedcaches import exports as placed_exports

    exports.update(placed_exports(current))
    return exports


def _env_text(value: Any) -> str:
    """A policy value as its environment variable spells it."""
    if isinstance(value, tuple):
        return ",".join(value)
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def cmd_env(args: argparse.Namespace) -> int:
    from sharedfs.machinery import runtime

    off = sharedfs_off(runtime.policy())
    # Everything is computed before the first line is printed: a failure leaves stdout empty, so
    # `exports="$(sharedfs env)"` takes nothing and its status 2 stops a `set -e` script there.
    exports = {} if off else env_exports()
    if off:
        _stderr(f"sharedfs env: {off}; nothing to export")
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


def cmd_demo(args: argparse.Namespace) -> int:
    from sharedfs.commands.demo import main as demo_main

    return demo_main(args, doctor_sections)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

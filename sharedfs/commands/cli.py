"""The ``sharedfs`` command: ``status``, ``doctor``, ``locks``, ``env``, ``cleanup``, ``demo`` (all with ``--json``).

Parses the command line, runs the command (most live in modules of their own) and ends each the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from sharedfs import __version__
from sharedfs.commands.doctor import cmd_doctor, doctor_sections, sharedfs_off
from sharedfs.commands.exits import EXIT_INTERRUPTED, EXIT_PIPE, EXIT_USAGE, error_line, stderr_line
from sharedfs.commands.status import cmd_status

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
                      description="What sharedfs does in this environment; with PATHs, also the filesystem each "
                                  "one is on, by name, and the lock sharedfs takes there (nothing is probed).")
    status.add_argument("paths", nargs="*", metavar="PATH",
                        help="paths to name the filesystem of, as doctor does (default: none)")
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
    demo.add_argument("--fs", metavar="NAME",
                      help="where the cross-node scenarios run: hostilefs (our FUSE fake, the default), or a real "
                           "juicefs, moosefs or glusterfs volume with one client mount per node")
    demo.add_argument("--only", action="append", metavar="TEXT",
                      help="run the scenarios whose name contains TEXT (repeatable)")
    demo.add_argument("--html", metavar="FILE", help="also write a one-page HTML report (for a ticket)")
    demo.add_argument("--markdown", metavar="FILE", help="also write the report as Markdown")
    demo.add_argument("--doctor", action="append", metavar="PATH",
                      help="paths whose `sharedfs doctor` verdict goes into the report (default: the current "
                           "directory; repeatable)")
    return parser


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
        stderr_line(f"sharedfs {args.command or ''}: interrupted".replace(" :", ":"))
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
        stderr_line(f"sharedfs {args.command}: {line}")
        return EXIT_USAGE
    return code


def _check_settings() -> None:
    """Resolve the settings as a framework's import would: a bad one is refused before the command runs."""
    from sharedfs.machinery import runtime

    unknown = runtime.unknown_disabled(runtime.policy())
    if unknown is not None:  # a program would go on with every shim on; a command says it is wrong
        raise unknown


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


# -- locks --------------------------------------------------------------------------------------


def cmd_locks(args: argparse.Namespace) -> int:
    from sharedfs.commands.lockfiles import main as locks_main

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
    """The variables a batch script should export so that a process without autoload gets our layout.

    Every directory is made (0700) or checked here, as the program's own placement would be; a refused
    one ends the command with one line and status 2 before anything is printed (docs/caches.md).
    """
    from sharedfs.errors import UnsafeDirectoryError
    from sharedfs.machinery import choices, runtime
    from sharedfs.model.settings import SETTINGS
    from sharedfs.startup import activation, placedcaches

    current = runtime.policy()
    exports: dict[str, str] = {}
    for setting in SETTINGS:
        if setting.name == "node_id":
            continue  # per process, never exported: `srun` would hand one node's name to every node
        value = getattr(current, setting.name)
        if current.source(setting.name) != "default" and value not in (None, ()):
            exports[setting.env] = _env_text(value)
    refused: dict[str, list[str]] = {}
    for state in activation.shim_states().values():
        try:
            placed = choices.cache_placement(state.shim, current)
        except UnsafeDirectoryError as exc:  # said with the placed caches' refusals, in one line
            refused.setdefault(str(exc), []).append(state.shim.cache_env or state.shim.name)
            continue
        if placed is not None and placed.path:
            exports[state.shim.cache_env or ""] = placed.path
    exports.update(placedcaches.exports(current, refused))
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
        stderr_line(f"sharedfs env: {off}; nothing to export")
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
    from sharedfs.commands.demo import main as demo_main

    return demo_main(args, doctor_sections)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

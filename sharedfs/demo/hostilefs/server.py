"""hostilefs's server process: mount with mfusepy, serve in the foreground, count operations, exit with its parent."""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from typing import Any, Optional

from .fuseops import _MOUNT_OPTIONS, HostileOps
from .mounting import _detach
from .nodeviews import _OpCounter
from .profiles import CONTROL_SOCKET, PROFILES, parse_profile


def _serve_control(path: str, counter: _OpCounter) -> None:
    """Answer ``stats`` / ``reset`` requests on the Unix socket ``path`` with the counts as one JSON line.

    A socket, not a signal: the main thread sits in libfuse's C loop, where no Python
    signal handler runs.  The socket lives in the server's private state directory.
    """
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(16)

    def loop() -> None:
        # Process-directed signals stay for the main thread, where libfuse's handler ends its loop.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
        while True:
            conn, _ = server.accept()
            with conn:
                try:
                    request = conn.makefile("rb").readline().strip()
                    if request not in (b"stats", b"reset"):
                        conn.sendall(b'{"error": "unknown request"}\n')
                        continue
                    conn.sendall(json.dumps(counter.snapshot(reset=request == b"reset")).encode() + b"\n")
                except OSError:
                    pass  # the client went away; the next one is served

    threading.Thread(target=loop, name="hostilefs-control", daemon=True).start()



def _may_allow_other() -> bool:
    """``allow_other`` needs root, or ``user_allow_other`` in /etc/fuse.conf."""
    if os.geteuid() == 0:
        return True
    try:
        with open("/etc/fuse.conf", encoding="utf-8") as f:
            return any(line.strip() == "user_allow_other" for line in f)
    except OSError:
        return False


def _exit_when_orphaned(mountpoint: str, state_dir: str, poll_s: float = 0.5) -> None:
    """Unmount, clean up and exit once the process that started us is gone.

    Protects against stale mounts when a test run is killed: SIGTERM makes
    libfuse leave its loop and unmount; lazy unmount + exit is the fallback.
    Nobody is left to remove ``state_dir``, so we do.
    """
    parent = os.getppid()

    def watch() -> None:
        # Keep process-directed signals for the main thread, where libfuse's
        # handler interrupts its wait loop.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
        while os.getppid() == parent:
            time.sleep(poll_s)
        atexit.register(shutil.rmtree, state_dir, ignore_errors=True)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # a worker stuck in a lock wait keeps libfuse from exiting
        _detach(mountpoint)
        shutil.rmtree(state_dir, ignore_errors=True)
        os._exit(1)

    threading.Thread(target=watch, name="orphan-watch", daemon=True).start()


def serve(
    backing: str,
    mountpoint: str,
    profile: str,
    *,
    lag_ms: float = 2000,
    latency_ms: float = 0,
    debug: bool = False,
    state_dir: Optional[str] = None,
    exit_with_parent: bool = False,
    count_ops: bool = False,
    flush_ms: float = 0,
) -> int:
    """Mount and serve in the foreground until unmounted or signalled.

    ``state_dir`` receives localflock's per-node shadow lock files (under
    ``locks/``); without it a private temporary directory is used and
    removed at exit.  ``exit_with_parent`` unmounts when the parent dies.
    ``count_ops`` counts operations per node and kind, served on
    ``state_dir/control.sock`` (see :meth:`HostileMount.op_counts`).
    """
    prof = parse_profile(profile)
    try:
        import mfusepy
    except ImportError:
        print("hostilefs: mfusepy is not installed: pip install mfusepy", file=sys.stderr)
        return 3
    except OSError as exc:  # mfusepy cannot find or load libfuse
        print(f"hostilefs: cannot load libfuse ({exc}): apt-get install libfuse2 (or libfuse3-3)",
              file=sys.stderr)
        return 3

    os.umask(0)  # the kernel already applied the caller's umask to modes
    own_state_dir = state_dir is None
    if state_dir is None:
        state_dir = tempfile.mkdtemp(prefix="hostilefs-")
    ops = HostileOps(backing, prof, lag_ms=lag_ms, latency_ms=latency_ms,
                     shadow_dir=os.path.join(state_dir, "locks"), context=mfusepy.fuse_get_context,
                     count_ops=count_ops, snapshot_dir=state_dir, flush_ms=flush_ms)
    if ops.counter is not None:
        _serve_control(os.path.join(state_dir, CONTROL_SOCKET), ops.counter)
    options: dict[str, Any] = dict(
        _MOUNT_OPTIONS,
        foreground=True,
        nothreads=False,  # blocking lock requests park a worker thread each
        allow_other=_may_allow_other(),  # other uids (tests dropping privileges) may use it
        default_permissions=True,  # the kernel checks modes (no FUSE_ACCESS), like a real fs
        fsname=f"hostilefs-{prof.name}",
        subtype="hostilefs",
        use_ino=True,
        debug=debug,
    )
    if mfusepy.fuse_version_major >= 3:
        # libfuse3 caps its worker pool at 10 threads by default, and 10
        # callers blocked in lock waits would stall the whole mount.  (3.14
        # also prints a harmless "Ignoring invalid max threads value".)
        options["max_threads"] = 256
    if exit_with_parent:
        _exit_when_orphaned(mountpoint, state_dir)
    try:
        mfusepy.FUSE(ops, mountpoint, raw_fi=True, **options)
    except RuntimeError as exc:
        # libfuse3 records the signal that ended the loop as a session error,
        # so fuse_main() reports a plain SIGTERM stop as 8 ("event loop
        # error"); mount failures use other codes.
        if not (mfusepy.fuse_version_major >= 3 and exc.args == (8,)):
            raise
    finally:
        if own_state_dir:
            shutil.rmtree(state_dir, ignore_errors=True)
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sharedfs.demo.hostilefs", description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default="plain", help=f"one of {', '.join(PROFILES)}, combinable with '+'")
    parser.add_argument("--lag-ms", type=float, default=2000, help="visibility lag of the lagging profile")
    parser.add_argument("--latency-ms", type=float, default=0, help="added to every metadata operation")
    parser.add_argument("--flush-ms", type=float, default=0,
                        help="nfs-cto: how long a close of a written file takes before other nodes see its data")
    parser.add_argument("--debug", action="store_true", help="libfuse debug output on stderr")
    parser.add_argument("--state-dir", help="directory for lock shadow files (default: private temp dir)")
    parser.add_argument("--exit-with-parent", action="store_true",
                        help="unmount (and remove --state-dir) when the parent process dies")
    parser.add_argument("--count-ops", action="store_true",
                        help=f"count operations per simulated node and kind (served on STATE_DIR/{CONTROL_SOCKET})")
    parser.add_argument("backing")
    parser.add_argument("mountpoint")
    args = parser.parse_args(argv)
    try:
        parse_profile(args.profile)
    except ValueError as exc:
        parser.error(str(exc))
    return serve(args.backing, args.mountpoint, args.profile, lag_ms=args.lag_ms, latency_ms=args.latency_ms,
                 debug=args.debug, state_dir=args.state_dir, exit_with_parent=args.exit_with_parent,
                 count_ops=args.count_ops, flush_ms=args.flush_ms)


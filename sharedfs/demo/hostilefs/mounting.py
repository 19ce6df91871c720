"""Start a hostilefs server for a test or the demo, wait until it serves, and unmount it again whatever happens."""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import functools
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from .profiles import CONTROL_SOCKET, FSTYPE, NODE_ENV, _PathLike, parse_profile


class FuseUnavailable(RuntimeError):
    """FUSE cannot work on this machine; ``str(exc)`` says why and what to install."""


class HostileMountError(RuntimeError):
    """hostilefs failed to start for a reason other than missing FUSE support."""


def _libfuse_path() -> Optional[str]:
    # The same search mfusepy does.
    return (os.environ.get("FUSE_LIBRARY_PATH") or ctypes.util.find_library("fuse")
            or ctypes.util.find_library("fuse3"))


@functools.lru_cache(maxsize=None)
def fuse_available() -> tuple[bool, str]:
    """``(True, "...")`` if hostilefs can probably mount here, else ``(False, reason)``.

    Checks the static prerequisites; mount permission itself shows only when
    mounting, where :func:`mount` raises :class:`FuseUnavailable`.
    """
    if not sys.platform.startswith("linux"):
        return False, f"hostilefs needs Linux FUSE (this is {sys.platform})"
    if not os.path.exists("/dev/fuse"):
        return False, ("/dev/fuse does not exist: no FUSE in this kernel or container "
                       "(containers need --device /dev/fuse --cap-add SYS_ADMIN)")
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError as exc:
        return False, f"cannot open /dev/fuse: {exc.strerror}"
    if importlib.util.find_spec("mfusepy") is None:
        return False, "mfusepy is not installed: pip install mfusepy"
    if not _libfuse_path():
        return False, "libfuse not found: apt-get install libfuse2 (or libfuse3-3)"
    if os.geteuid() != 0 and not (shutil.which("fusermount3") or shutil.which("fusermount")):
        return False, "mounting FUSE as non-root needs fusermount: apt-get install fuse3"
    return True, "FUSE is available"


def _unescape_mountinfo(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _mounts() -> list[tuple[str, str, str]]:
    """``(mount point, fstype, source)`` for every mount, from /proc/self/mountinfo."""
    out = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, rfields = left.split(), right.split()
            if len(fields) >= 5 and len(rfields) >= 2:
                out.append((_unescape_mountinfo(fields[4]), rfields[0], _unescape_mountinfo(rfields[1])))
    return out


def is_mounted(path: _PathLike, fstype: Optional[str] = None) -> bool:
    """Whether ``path`` is a mount point (of ``fstype``, if given)."""
    # abspath, not realpath: resolving a dead FUSE mount would fail or hang.
    target = os.path.abspath(path)
    return any(mp == target and (fstype is None or ft == fstype) for mp, ft, _ in _mounts())


def _detach(path: _PathLike) -> None:
    """Lazily unmount ``path`` (works while busy or after the server died)."""
    path = os.fspath(path)
    if os.geteuid() == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.umount2(os.fsencode(path), 2) == 0:  # MNT_DETACH
            return
    for cmd in (["fusermount3", "-u", "-z", path], ["fusermount", "-u", "-z", path], ["umount", "-l", path]):
        if shutil.which(cmd[0]):
            if subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0:
                return


def _classify_failure(log: str, returncode: int) -> Exception:
    """Turn the server's dying words into FuseUnavailable or HostileMountError."""
    text = log.strip() or f"(no output, exit code {returncode})"
    lowered = text.lower()
    if "mfusepy is not installed" in lowered or "no module named 'mfusepy'" in lowered:
        return FuseUnavailable("mfusepy is not installed: pip install mfusepy")
    if "cannot load libfuse" in lowered or "unable to find libfuse" in lowered:
        return FuseUnavailable(f"libfuse unusable: {text}")
    if "device not found" in lowered or "/dev/fuse" in lowered:
        return FuseUnavailable(f"FUSE device unusable: {text}")
    if "not permitted" in lowered or "permission denied" in lowered or "fusermount" in lowered:
        return FuseUnavailable(f"mounting FUSE is not permitted here: {text}")
    return HostileMountError(f"hostilefs exited with code {returncode}:\n{text}")


_LIVE: "set[HostileMount]" = set()
_SCRIPT = Path(__file__).resolve().with_name("hostilefs.py")


class HostileMount:
    """A running hostilefs mount; unmounts on :meth:`unmount` or context exit.

    ``path`` is the mount point, ``backing`` the real directory behind it
    (write there to seed files every node sees at once).
    """

    def __init__(self, path: Path, backing: Path, profile: str, lag_ms: float, latency_ms: float,
                 process: "subprocess.Popen[bytes]", state_dir: str, count_ops: bool = False) -> None:
        self.path = path
        self.backing = backing
        self.profile = profile
        self.lag_ms = lag_ms
        self.latency_ms = latency_ms
        self.process = process
        self.state_dir = state_dir  # server.log + localflock shadow files; removed on unmount
        self.count_ops = count_ops
        self._log_text: Optional[str] = None
        self._closed = False

    def __repr__(self) -> str:
        state = "unmounted" if self._closed else "mounted"
        return f"<HostileMount {self.profile} {self.path} ({state}, pid {self.process.pid})>"

    def __enter__(self) -> "HostileMount":
        return self

    def __exit__(self, *exc: object) -> None:
        self.unmount()

    @property
    def mounted(self) -> bool:
        return not self._closed and is_mounted(self.path, FSTYPE)

    def log(self) -> str:
        """The server's stdout/stderr so far (useful in assertion messages)."""
        if self._log_text is not None:
            return self._log_text
        try:
            with open(os.path.join(self.state_dir, "server.log"), encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def op_counts(self, reset: bool = False) -> dict[str, dict[str, int]]:
        """``{node: {operation: count}}`` of every operation served so far (``count_ops=True`` mounts only).

        ``reset=True`` returns the counts and starts from zero in the same step, so consecutive
        calls measure back-to-back windows without losing an operation in between.  Operations
        the kernel makes on nobody's behalf count under node ``default``.
        """
        if not self.count_ops:
            raise HostileMountError(f"{self} counts no operations: mount it with count_ops=True")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(30)
            conn.connect(os.path.join(self.state_dir, CONTROL_SOCKET))
            conn.sendall(b"reset\n" if reset else b"stats\n")
            answer = conn.makefile("rb").readline()
        counts = json.loads(answer)
        if "error" in counts:
            raise HostileMountError(f"hostilefs control socket: {counts['error']}")
        return counts

    def unmount(self, grace: float = 2.0) -> None:
        """Unmount and stop the server. Idempotent; never leaves a stale mount.

        SIGTERM lets libfuse unmount and exit (~15 ms).  A server with a
        worker still parked in a blocking lock cannot finish that way, so
        after ``grace`` seconds the mount is detached lazily and the server
        killed; callers still inside it then get ECONNABORTED.
        """
        if self._closed:
            return
        self._closed = True
        _LIVE.discard(self)
        proc = self.process
        try:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    pass
            if is_mounted(self.path):
                _detach(self.path)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if is_mounted(self.path):
                _detach(self.path)
        finally:
            self._log_text = self.log()
            shutil.rmtree(self.state_dir, ignore_errors=True)


def mount(
    backing: _PathLike,
    mountpoint: _PathLike,
    profile: str = "plain",
    *,
    lag_ms: float = 2000,
    latency_ms: float = 0,
    timeout: float = 10.0,
    debug: bool = False,
    count_ops: bool = False,
    flush_ms: float = 0,
) -> HostileMount:
    """Mount hostilefs over ``backing`` at ``mountpoint`` and wait until it serves.

    Both directories are created if missing.  ``count_ops`` counts every operation per
    simulated node and kind (read them with :meth:`HostileMount.op_counts`); ``flush_ms`` is ``nfs-cto``'s
    time a close of a written file takes to reach the other nodes.  Raises :class:`FuseUnavailable`
    when FUSE cannot work here and :class:`HostileMountError` for other
    failures.  The server runs as ``sys.executable .../hostilefs.py`` (by
    path, so a half-written ``sharedfs/__init__.py`` cannot break it), in
    its own session, and unmounts itself if the calling process dies.
    """
    parse_profile(profile)  # fail fast on typos
    ok, reason = fuse_available()
    if not ok:
        raise FuseUnavailable(reason)
    backing_p = Path(os.path.realpath(backing))
    mnt = Path(os.path.realpath(mountpoint))
    backing_p.mkdir(parents=True, exist_ok=True)
    if is_mounted(mnt, FSTYPE):  # left over from a killed run
        _detach(mnt)
    elif is_mounted(mnt):
        raise HostileMountError(f"{mnt} is already a mount point")
    mnt.mkdir(parents=True, exist_ok=True)

    state_dir = tempfile.mkdtemp(prefix="hostilefs-")
    cmd = [sys.executable, str(_SCRIPT), "--profile", profile, "--lag-ms", str(lag_ms),
           "--latency-ms", str(latency_ms), "--state-dir", state_dir, "--exit-with-parent"]
    if flush_ms:
        cmd += ["--flush-ms", str(flush_ms)]
    if debug:
        cmd.append("--debug")
    if count_ops:
        if len(os.fsencode(os.path.join(state_dir, CONTROL_SOCKET))) >= 108:  # sun_path, NUL included
            shutil.rmtree(state_dir, ignore_errors=True)
            raise HostileMountError(f"the control socket path under {state_dir} is too long for a Unix socket: "
                                    "point TMPDIR at a shorter directory")
        cmd.append("--count-ops")
    cmd += [str(backing_p), str(mnt)]
    env = {k: v for k, v in os.environ.items()
           if k not in (NODE_ENV, "SHAREDFS_FAULT_PREFIXES")}  # the server is nobody's node
    with open(os.path.join(state_dir, "server.log"), "wb") as log:
        # New session: a terminal Ctrl-C must not kill the server before the
        # test process has unmounted.
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)
    m = HostileMount(mnt, backing_p, profile, lag_ms, latency_ms, proc, state_dir, count_ops)
    _LIVE.add(m)
    deadline = time.monotonic() + timeout
    try:
        while not is_mounted(mnt, FSTYPE):
            rc = proc.poll()
            if rc is not None:
                raise _classify_failure(m.log(), rc)
            if time.monotonic() > deadline:
                raise HostileMountError(f"hostilefs did not mount {mnt} within {timeout}s:\n{m.log()}")
            time.sleep(0.02)
        os.stat(mnt)  # first request: returns once the server answers
        if count_ops:
            m.op_counts(reset=True)  # the socket is bound before the mount serves; start from zero
    except BaseException:
        m.unmount()
        raise
    return m



@atexit.register
def _unmount_all() -> None:
    for m in list(_LIVE):
        m.unmount()


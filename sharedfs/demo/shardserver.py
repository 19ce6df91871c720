"""A local HTTP server that serves real WebDataset tar shards and counts GETs per shard.

Started by a test (or a benchmark) on 127.0.0.1 with a free port, in a daemon
thread of the calling process; it stops itself after ``max_seconds`` even if
the caller forgets, and on ``close()`` / leaving the ``with`` block.

``delay`` holds every response for that long before the body (so that
concurrent readers really overlap, as they do against S3); ``midway`` pauses
that long after the first half of the body (a download in progress for a
while, with bytes already on disk); a shard named in
``stall`` sends half its bytes and then holds the connection until the server
stops (a download to SIGKILL mid-way); a shard named in ``drop`` sends half its
bytes and closes the connection (a download that fails mid-way).
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import threading
import time
from collections import Counter
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

__all__ = ["ShardServer", "make_shards", "sample_digest", "start_together", "wait_until"]


def sample_digest(key: str, data: bytes) -> str:
    return hashlib.sha256(key.encode() + b"\0" + data).hexdigest()[:16]


def make_shards(directory: Path, count: int = 8, samples: int = 20, size: int = 2048,
                prefix: str = "shard") -> dict[str, str]:
    """Write ``count`` webdataset shards (``<key>.bin`` + ``<key>.txt`` per sample) into ``directory``.

    Returns ``{sample key: digest of its .bin}`` over all shards, to compare with what readers got.
    """
    directory.mkdir(parents=True, exist_ok=True)
    expected: dict[str, str] = {}
    for s in range(count):
        with tarfile.open(directory / f"{prefix}-{s:06d}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(samples):
                key = f"s{s:03d}_{i:05d}"
                data = hashlib.sha256(key.encode()).digest() * (size // 32)
                expected[key] = sample_digest(key, data)
                for ext, payload in (("bin", data), ("txt", key.encode())):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(payload)
                    info.mtime = 0
                    tar.addfile(info, io.BytesIO(payload))
    return expected


class ShardServer:
    """Serve ``root`` over HTTP on 127.0.0.1; ``gets[name]`` counts GET requests per file."""

    def __init__(self, root: Path, *, delay: float = 0.0, midway: float = 0.0, stall: Iterable[str] = (),
                 drop: Iterable[str] = (), max_seconds: float = 300.0) -> None:
        self.root = Path(root)
        self.delay = delay
        self.midway = midway
        self.stall = set(stall)
        self.drop = set(drop)
        self.gets: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *args: object) -> None:  # keep test output readable
                pass

            def do_GET(self) -> None:
                name = self.path.lstrip("/").split("?", 1)[0]
                path = server.root / name
                if "/" in name or not path.is_file():
                    self.send_error(404)
                    return
                with server._lock:
                    server.gets[name] += 1
                data = path.read_bytes()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-tar")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if server.delay:
                    server._stop.wait(server.delay)
                try:
                    if name in server.stall or name in server.drop:
                        self.wfile.write(data[: len(data) // 2])
                        self.wfile.flush()
                        if name in server.stall:
                            server._stop.wait()
                        self.close_connection = True
                        return
                    if server.midway:
                        self.wfile.write(data[: len(data) // 2])
                        self.wfile.flush()
                        server._stop.wait(server.midway)
                        data = data[len(data) // 2:]
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the reader was killed: that is what some tests do

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="shardserver", daemon=True)
        self._thread.start()
        self._deadline = threading.Timer(max_seconds, self.close)
        self._deadline.daemon = True
        self._deadline.start()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    def urls(self, names: Iterable[str]) -> list[str]:
        return [self.url(n) for n in names]

    def shard_names(self) -> list[str]:
        return sorted(p.name for p in self.root.glob("*.tar"))

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self.gets)

    def reset(self) -> None:
        with self._lock:
            self.gets.clear()

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._deadline.cancel()
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> ShardServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_together(gate: str, timeout: float = 60.0) -> None:
    """Barrier for the processes of :func:`sharedfs.demo.nodes.run_on_nodes` (a local directory ``gate``).

    Each process announces itself, then waits until all ``SHAREDFS_TEST_COUNT`` have: the
    concurrency a test wants to show must not depend on how fast each one imported torch.
    """
    os.makedirs(gate, exist_ok=True)
    Path(gate, os.environ.get("SHAREDFS_TEST_INDEX", str(os.getpid()))).touch()
    count = int(os.environ.get("SHAREDFS_TEST_COUNT", "1"))
    if not wait_until(lambda: len(os.listdir(gate)) >= count, timeout=timeout, interval=0.005):
        raise TimeoutError(f"only {len(os.listdir(gate))} of {count} processes reached {gate}")


def wait_until(predicate, timeout: float = 30.0, interval: float = 0.02) -> bool:
    """Poll ``predicate`` until true or ``timeout``; returns its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


if __name__ == "__main__":  # pragma: no cover - manual use: serve a directory until Ctrl-C
    import sys

    with ShardServer(Path(sys.argv[1] if len(sys.argv) > 1 else os.getcwd())) as s:
        print(f"serving on http://127.0.0.1:{s.port}/", flush=True)
        s._thread.join()

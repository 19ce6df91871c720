"""torch.hub on a mount whose other node sees new files late: one checkpoint download per cache.

4 ranks on 2 nodes call ``torch.hub.load_state_dict_from_url`` for one checkpoint on a ``hostilefs``
mount lagging 3 s (a node's new entries stay "missing" to the other node, as behind a negative-lookup
cache).  The torch_hub shim runs torch's check-then-download under ``sharedfs.lock``.  sharedfs before
the handover rule (``BEFORE``, run from a worktree) downloaded once per node: the first holder on the
second node found the file the first node had published "missing" and downloaded it again.  Now
the lock's next holder on another node waits out the mount's lag before its ``acquire()`` returns
(docs/api.md, "What the next holder sees"), and the checkpoint is downloaded once.
"""

from __future__ import annotations

import http.server
import io
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers import ROOT, require

from sharedfs.testing import node_env
from sharedfs.testing.hostilefs import HostileMount

require("torch", "needs torch (scripts/requirements-test.txt)")

pytestmark = pytest.mark.slow

RANKS = 4
#: The last commit before the handover rule.
BEFORE = "0682dc4"
RANK = """
import json, os, sys, time
from pathlib import Path
import torch
sync, url, model_dir = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
rank = os.environ["SHAREDFS_TEST_INDEX"]
(sync / f"ready-{rank}").touch()
while not (sync / "go").exists():
    time.sleep(0.005)
state = torch.hub.load_state_dict_from_url(url, model_dir=model_dir, progress=False)
print(json.dumps({"sum": float(state["weight"].sum())}))
"""


class SlowServer(http.server.ThreadingHTTPServer):
    """Serves one checkpoint in about a second (a busy mirror) and counts the GETs."""

    daemon_threads = True

    def __init__(self, payload: bytes) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.payload = payload
        self.gets = 0
        self.mu = threading.Lock()


class _Handler(http.server.BaseHTTPRequestHandler):
    server: SlowServer

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        with self.server.mu:
            self.server.gets += 1
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.server.payload)))
        self.end_headers()
        for start in range(0, len(self.server.payload), 64 * 1024):
            self.wfile.write(self.server.payload[start:start + 64 * 1024])
            time.sleep(0.05)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[SlowServer]:
    import torch

    buffer = io.BytesIO()
    torch.save({"weight": torch.arange(300_000, dtype=torch.float32)}, buffer)  # 1.2 MB
    srv = SlowServer(buffer.getvalue())
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def before_checkout(tmp_path: Path) -> Iterator[Path]:
    """:data:`BEFORE` as a worktree (removed afterwards): sharedfs without the handover rule."""
    where = tmp_path / "before"
    made = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), BEFORE],
                          capture_output=True, text=True, check=False)
    assert made.returncode == 0, made.stderr
    yield where
    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(where)], capture_output=True,
                   check=False)


def download_on_ranks(root: Path, server: SlowServer, code: Path | None) -> tuple[int, list[dict[str, float]]]:
    """:data:`RANKS` ranks on nodes a and b load the checkpoint into ``root``; (GETs, what each loaded)."""
    sync, model_dir = root.parent / f"sync-{root.name}", root / "checkpoints"
    sync.mkdir()
    url = f"http://127.0.0.1:{server.server_address[1]}/weights/resnet-tiny.pth"
    before = server.gets
    env = {**os.environ, "TORCH_HOME": str(root / "torch-home")}
    if code is not None:  # the old checkout first on sys.path: its bootstrap, package, shims and plugins
        env["PYTHONPATH"] = str(code)
    ranks = [subprocess.Popen([sys.executable, "-c", RANK, str(sync), url, str(model_dir)], text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=code,
                              env=node_env("ab"[i % 2], env, SHAREDFS_TEST_INDEX=i))
             for i in range(RANKS)]
    try:
        deadline = time.monotonic() + 300
        while len(list(sync.glob("ready-*"))) < RANKS:
            assert all(r.poll() is None for r in ranks), [r.communicate() for r in ranks if r.poll() is not None]
            assert time.monotonic() < deadline, "ranks never got ready"
            time.sleep(0.01)
        (sync / "go").touch()
        results = []
        for rank in ranks:
            out, err = rank.communicate(timeout=300)
            assert rank.returncode == 0, err[-3000:]
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
                rank.wait()
    return server.gets - before, results


def test_ranks_on_two_nodes_of_a_lagging_mount_download_a_checkpoint_once(
        server: SlowServer, hostile_mount: Callable[..., HostileMount], before_checkout: Path) -> None:
    import torch

    expected = [{"sum": float(torch.arange(300_000, dtype=torch.float32).sum())}] * RANKS
    mount = Path(hostile_mount("lagging", lag_ms=3000).path)
    old_gets, old = download_on_ranks(mount / "before", server, before_checkout)
    gets, now = download_on_ranks(mount / "now", server, None)
    print(f"{RANKS} ranks on 2 nodes, hostilefs lagging 3 s: sharedfs {BEFORE} {old_gets} downloads, "
          f"now {gets}")
    assert old_gets >= 2, "the second node's first holder should have found the checkpoint missing"
    assert gets == 1
    assert old == expected and now == expected

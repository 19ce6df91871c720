"""The torch_hub shim: 8 ranks call ``torch.hub.load_state_dict_from_url`` for one checkpoint at once.

Real torch, real processes, a local HTTP server on 127.0.0.1 that serves a checkpoint slowly
(as a busy mirror does) and counts the GETs.  Stock (``SHAREDFS_DISABLE=torch_hub``) every rank
finds the file missing and downloads its own copy; with sharedfs one rank downloads and the others
wait, then load that file.  Every rank loads the same tensors either way.
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
from pathlib import Path
from typing import Iterator

import pytest
from helpers import require

from sharedfs.testing import node_env

require("torch", "needs torch (scripts/requirements-test.txt)")

pytestmark = pytest.mark.slow

RANKS = 8
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
        for start in range(0, len(self.server.payload), 64 * 1024):  # about 1 s for the whole file
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


def load_on_ranks(tmp_path: Path, server: SlowServer, label: str, disable: str) -> tuple[int, list[dict[str, float]]]:
    sync, model_dir = tmp_path / f"sync-{label}", tmp_path / f"checkpoints-{label}"
    sync.mkdir()
    url = f"http://127.0.0.1:{server.server_address[1]}/weights/resnet-tiny.pth"
    before = server.gets
    env = {**os.environ, "SHAREDFS_DISABLE": disable, "TORCH_HOME": str(tmp_path / "torch-home")}
    ranks = [subprocess.Popen([sys.executable, "-c", RANK, str(sync), url, str(model_dir)], text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=node_env("a" if i % 2 else "b", env, SHAREDFS_TEST_INDEX=i))
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
    assert not [p for p in model_dir.iterdir() if p.name.endswith(".partial")]
    return server.gets - before, results


def test_eight_ranks_download_a_checkpoint_eight_times_stock_and_once_with_sharedfs(tmp_path: Path,
                                                                                  server: SlowServer) -> None:
    import torch

    expected = [{"sum": float(torch.arange(300_000, dtype=torch.float32).sum())}] * RANKS
    stock_gets, stock = load_on_ranks(tmp_path, server, "stock", "torch_hub")
    assert stock == expected
    assert stock_gets > 1, "every rank should have found the checkpoint missing and fetched it"
    gets, shared = load_on_ranks(tmp_path, server, "sharedfs", "")
    print(f"{RANKS} ranks: {stock_gets} downloads stock, {gets} with sharedfs")
    assert shared == expected
    assert gets == 1

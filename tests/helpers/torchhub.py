"""torch.hub checkpoint downloads from ranks on two nodes, counted at the server.

Shared by the torch.hub tests on ``hostilefs`` (test_torch_hub_handover.py) and on the real
filesystems (test_realfs_caches.py)::

    with checkpoint_server() as server, worktree(BEFORE, tmp_path / "before") as old:
        gets, loaded = download_on_ranks([root], tmp_path / "sync", server, old)
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
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from helpers.env import ROOT
from sharedfs.demo import node_env

#: The last commit before the handover rule (docs/api.md, "What the next holder sees").
BEFORE = "0682dc4"
RANKS = 4
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


def expected_loads() -> list[dict[str, float]]:
    """What every rank must have loaded."""
    import torch

    return [{"sum": float(torch.arange(300_000, dtype=torch.float32).sum())}] * RANKS


@contextmanager
def checkpoint_server() -> Iterator[SlowServer]:
    """A :class:`SlowServer` of a 1.2 MB checkpoint, serving until the block ends."""
    import torch

    buffer = io.BytesIO()
    torch.save({"weight": torch.arange(300_000, dtype=torch.float32)}, buffer)
    srv = SlowServer(buffer.getvalue())
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


@contextmanager
def worktree(commit: str, where: Path) -> Iterator[Path]:
    """``commit`` of this repository checked out at ``where`` (removed afterwards): an old sharedfs to run."""
    made = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), commit],
                          capture_output=True, text=True, check=False)
    assert made.returncode == 0, made.stderr
    try:
        yield where
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(where)], capture_output=True,
                       check=False)


def download_on_ranks(roots: Sequence[Path], sync: Path, server: SlowServer, code: Path | None,
                      env: Mapping[str, str] | None = None,
                      may_fail: bool = False) -> tuple[int, list[dict[str, Any]]]:
    """:data:`RANKS` ranks on nodes a and b load the checkpoint; (GETs, what each loaded).

    With ``may_fail`` a rank that fails gives ``{"error": <its last line>}`` instead of failing the test.

    Rank ``i`` runs on node ``"ab"[i % 2]`` and reaches the cache through ``roots[i % len(roots)]``
    (one path for a mount every node shares, or one client mount per node).  ``sync`` is a new
    directory all ranks see at once (a local disk, or a mount without lag); ``code`` an old
    checkout to run instead of this one.
    """
    sync.mkdir()
    url = f"http://127.0.0.1:{server.server_address[1]}/weights/resnet-tiny.pth"
    before = server.gets
    env = {**(os.environ if env is None else env)}
    if code is not None:  # the old checkout first on sys.path: its bootstrap, package, shims and plugins
        env["PYTHONPATH"] = str(code)
    ranks = []
    for i in range(RANKS):
        root = roots[i % len(roots)]
        node_vars = node_env("ab"[i % 2], {**env, "TORCH_HOME": str(root / "torch-home")}, SHAREDFS_TEST_INDEX=i)
        ranks.append(subprocess.Popen([sys.executable, "-c", RANK, str(sync), url, str(root / "checkpoints")],
                                      text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=code,
                                      env=node_vars))
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
            if rank.returncode != 0 and may_fail:
                results.append({"error": err.strip().splitlines()[-1]})
                continue
            assert rank.returncode == 0, err[-3000:]
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
                rank.wait()
    return server.gets - before, results

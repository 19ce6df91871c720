"""The shard cache on two nodes of a mount that answers ESTALE: the vanished file it is, never a crash (issue 49).

hostilefs's ``estale`` profile makes a file one node unlinks or renames over answer ``[Errno 116]
Stale file handle`` to the other nodes' open handles (read, write, fstat, fsync, close), as
GlusterFS and NFS do.  Here node0 downloads a shard while node1 removes that download's claim (an
operator's clean-up of the coordination tree, another node's sweep): node0's descriptor of its
claim goes stale.  The code before this change (unpacked with git archive, first on PYTHONPATH)
crashes out of ``ensure`` with ESTALE (from writing the claim's "published" record); this checkout
publishes the shard: the claim it can no longer write promises nothing.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from harness.skips import skip_or_fail
from helpers import ROOT, clean_env

#: The commit before ESTALE was handled in the caches.
BEFORE = "4fff9d3"

#: node0's process: ``ensure`` one shard; the download has node1 (its own process) remove the claim first.
WORKER = r"""
import glob, os, subprocess, sys
from sharedfs.shardcache.fetch import ensure

cache = sys.argv[1]
os.makedirs(cache, exist_ok=True)
dest = os.path.join(cache, "shard-000.tar")
tree = os.path.join(os.path.dirname(cache), "." + os.path.basename(cache) + ".sharedfs")

def download(path):
    with open(path, "wb") as f:
        f.write(b"x" * 4096)
    claims = glob.glob(os.path.join(tree, "claims", "*"))
    assert claims, "no claim while downloading"
    node1 = {**os.environ, "SHAREDFS_NODE_ID": "node1"}
    subprocess.run([sys.executable, "-c", "import os, sys; [os.unlink(p) for p in sys.argv[1:]]", *claims],
                   env=node1, check=True)

ensure(dest, download)
with open(dest, "rb") as f:
    assert f.read() == b"x" * 4096
print("published")
"""


@pytest.fixture(scope="module")
def old_sharedfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """sharedfs at BEFORE, unpacked (git archive, the repository untouched), to put first on PYTHONPATH."""
    if shutil.which("git") is None:
        skip_or_fail("git is needed to unpack sharedfs at " + BEFORE)
    tree = tmp_path_factory.mktemp("sharedfs-" + BEFORE)
    archive = tree / "src.tar"
    proc = subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(archive), BEFORE], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        skip_or_fail(f"cannot unpack sharedfs at {BEFORE} (a shallow clone?): {proc.stderr.strip()}")
    with tarfile.open(archive) as tar:
        tar.extractall(tree)
    archive.unlink()
    return tree


def run(cache: Path, old: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {"SHAREDFS_NODE_ID": "node0"}
    if old is not None:
        env["PYTHONPATH"] = str(old)
    # Run from "/": ``python -c`` puts the working directory (the checkout, under pytest) first on sys.path.
    return subprocess.run([sys.executable, "-c", WORKER, str(cache)], env=clean_env(env), cwd="/",
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)


def last_line(proc: subprocess.CompletedProcess[str]) -> str:
    text = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
    return text[-1] if text else f"exit {proc.returncode}"


def test_claim_removed_by_another_node_mid_download(hostile_mount, old_sharedfs: Path) -> None:
    mnt = hostile_mount("estale").path

    before = run(mnt / "old", old_sharedfs)
    print(f"sharedfs {BEFORE}, download finishes:", before.returncode, last_line(before))
    assert before.returncode != 0 and "Stale file handle" in before.stderr, before.stderr
    assert ", in publish" in before.stderr, before.stderr  # writing the record of a claim node1 removed

    after = run(mnt / "new")
    print("sharedfs, download finishes:", after.returncode, last_line(after))
    assert after.returncode == 0 and after.stdout.strip().endswith("published"), after.stderr


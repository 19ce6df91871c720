"""A placed cache variable naming another user's node-local directory is an inherited export, not a setting.

The process that runs as another user is in tests/integration/test_inherited_placement.py; here, the
decision and its undoing in one process.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sharedfs.cluster.nodelocal import made_for_uid
from sharedfs.startup import placedcaches


@pytest.mark.parametrize(("path", "uid"), [
    ("/tmp/sharedfs-0/nojob/triton", 0),
    ("/scratch/tmp/sharedfs-1005/job-77/flashinfer/", 1005),
    ("/tmp/sharedfs-0/nojob", None),  # the job level, not a cache's directory
    ("/home/alice/.triton/cache", None),
    ("/tmp/sharedfs-x1/nojob/triton", None),
    ("tmp/sharedfs-0/nojob/triton", None),  # relative: nothing sharedfs exports
])
def test_made_for_uid_reads_the_user_level_of_the_layout(path: str, uid: int | None) -> None:
    assert made_for_uid(path) == uid


def test_another_users_export_is_replaced_by_ours_and_put_back_by_restore(
        fresh_runtime, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir(mode=0o700)
    monkeypatch.setenv("SHAREDFS_CACHE", "node-local")
    monkeypatch.setenv("SHAREDFS_CACHE_ROOT", str(root))
    theirs = f"{root}/sharedfs-{os.getuid() + 1}/nojob/triton"
    own_earlier = f"{root}/sharedfs-{os.getuid()}/nojob/elsewhere"
    monkeypatch.setenv("TRITON_CACHE_DIR", theirs)
    monkeypatch.setenv("DG_JIT_CACHE_DIR", own_earlier)  # ours (a parent of this user's): the user's value
    try:
        placedcaches.place(fresh_runtime.policy())
        assert os.environ["TRITON_CACHE_DIR"] == f"{root}/sharedfs-{os.getuid()}/nojob/triton"
        assert os.environ["DG_JIT_CACHE_DIR"] == own_earlier
    finally:
        placedcaches.restore()
    assert os.environ["TRITON_CACHE_DIR"] == theirs
    assert os.environ["DG_JIT_CACHE_DIR"] == own_earlier


def test_another_users_export_is_unset_when_nothing_is_placed(fresh_runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHAREDFS_CACHE", "shared")  # nothing placed: the library's own default
    theirs = f"/tmp/sharedfs-{os.getuid() + 1}/nojob/triton"
    monkeypatch.setenv("TRITON_CACHE_DIR", theirs)
    try:
        placedcaches.place(fresh_runtime.policy())
        assert "TRITON_CACHE_DIR" not in os.environ
    finally:
        placedcaches.restore()
    assert os.environ["TRITON_CACHE_DIR"] == theirs

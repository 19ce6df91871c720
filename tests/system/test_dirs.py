"""node_local_dir refuses hostile directories; makedirs and wait_for behave on local disk."""

from __future__ import annotations

import os
import stat
import threading
import time
from pathlib import Path

import pytest

import sharedfs
from sharedfs.cluster.dirs import node_local_dir


@pytest.fixture
def root(tmp_path: Path, fresh_runtime, monkeypatch) -> Path:
    monkeypatch.setenv("SHAREDFS_CACHE_ROOT", str(tmp_path))
    monkeypatch.setenv("SLURM_JOB_ID", "1234")
    return tmp_path


def test_node_local_dir_is_private_and_job_scoped(root: Path) -> None:
    path = node_local_dir("hf_datasets")
    assert path == root / f"sharedfs-{os.getuid()}" / "job-1234" / "hf_datasets"
    for level in (path, path.parent, path.parent.parent):
        assert stat.S_IMODE(level.stat().st_mode) == 0o700
    assert node_local_dir("hf_datasets") == path  # idempotent


def test_node_local_dir_refuses_a_directory_planted_by_another_user(root: Path) -> None:
    planted = root / f"sharedfs-{os.getuid()}"
    planted.mkdir(mode=0o700)
    os.chown(planted, 65534, 65534)  # nobody: the tests run as root, as CI does
    with pytest.raises(sharedfs.UnsafeDirectoryError, match="owned by uid 65534, not you"):
        node_local_dir("hf_datasets")


def test_node_local_dir_refuses_a_symlink(root: Path, tmp_path_factory) -> None:
    elsewhere = tmp_path_factory.mktemp("attacker")
    (root / f"sharedfs-{os.getuid()}").symlink_to(elsewhere)
    with pytest.raises(sharedfs.UnsafeDirectoryError, match="is a symlink"):
        node_local_dir("hf_datasets")
    assert list(elsewhere.iterdir()) == []


def test_node_local_dir_refuses_a_world_writable_root_without_sticky_bit(root: Path) -> None:
    root.chmod(0o777)
    with pytest.raises(sharedfs.UnsafeDirectoryError) as info:
        node_local_dir("hf_datasets")
    assert str(info.value).startswith(
        f"SHAREDFS_CACHE_ROOT={root}: the node-local root is writable by every user without the sticky bit (mode 777)")
    assert f"`chmod +t {root}`" in str(info.value)
    root.chmod(0o775)
    with pytest.raises(sharedfs.UnsafeDirectoryError, match="writable by every member of group 0 without the sticky"):
        node_local_dir("hf_datasets")
    root.chmod(0o1777)
    assert node_local_dir("hf_datasets").is_dir()


def test_a_missing_cache_root_names_the_variable_and_the_fix(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHAREDFS_CACHE_ROOT", str(root / "missing"))
    with pytest.raises(sharedfs.UnsafeDirectoryError) as info:
        node_local_dir("hf_datasets")
    assert str(info.value) == (f"SHAREDFS_CACHE_ROOT={root}/missing: the node-local root does not exist on this node; "
                               "create it on every node or point SHAREDFS_CACHE_ROOT at a local directory of your own "
                               "(or $SLURM_TMPDIR, /tmp)")


def test_a_file_as_cache_root_is_an_unsafe_directory_error(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (root / "file").write_text("x")
    monkeypatch.setenv("SHAREDFS_CACHE_ROOT", str(root / "file"))
    with pytest.raises(sharedfs.UnsafeDirectoryError,
                       match=f"^SHAREDFS_CACHE_ROOT={root}/file: the node-local root is not a directory "
                             r"\(a regular file\); point SHAREDFS_CACHE_ROOT at"):
        node_local_dir("hf_datasets")


def test_a_cache_root_of_another_user_is_refused(root: Path) -> None:
    os.chown(root, 65534, 65534)
    with pytest.raises(sharedfs.UnsafeDirectoryError, match="owned by uid 65534 \\(neither you nor root\\)"):
        node_local_dir("hf_datasets")


def test_the_error_names_where_the_root_came_from(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SHAREDFS_CACHE_ROOT")
    monkeypatch.setenv("TMPDIR", str(root / "gone"))
    with pytest.raises(sharedfs.UnsafeDirectoryError, match=f"^TMPDIR={root}/gone: the node-local root does not"):
        node_local_dir("hf_datasets")


def test_a_relative_tmpdir_is_refused(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SHAREDFS_CACHE_ROOT")
    monkeypatch.setenv("TMPDIR", "scratch")
    with pytest.raises(sharedfs.UnsafeDirectoryError, match="^TMPDIR=scratch: the node-local root must be an absolute"):
        node_local_dir("hf_datasets")


def test_the_cache_plugin_raises_the_same_error(root: Path, fresh_runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a framework import meets under cache=node-local (it used to be a bare NotADirectoryError)."""
    from sharedfs.model.policy import CacheRequest

    (root / "file").write_text("x")
    monkeypatch.setenv("SHAREDFS_CACHE_ROOT", str(root / "file"))
    request = CacheRequest("wids", "WIDS_CACHE", None, "/tmp/_wids_cache")
    with pytest.raises(sharedfs.UnsafeDirectoryError, match="SHAREDFS_CACHE_ROOT="):
        fresh_runtime.registry().cache_placement(request, fresh_runtime.policy(cache="node-local"))


def test_makedirs_is_idempotent_and_refuses_a_file(tmp_path: Path, fresh_runtime) -> None:
    target = tmp_path / "a" / "b" / "c"
    assert sharedfs.makedirs(target) == target and sharedfs.makedirs(target) == target
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError, match="not a directory"):
        sharedfs.makedirs(tmp_path / "file", timeout=0.2)


def test_wait_for_returns_when_the_path_appears_and_times_out_with_context(tmp_path: Path, fresh_runtime) -> None:
    later = tmp_path / "later"
    threading.Timer(0.3, later.mkdir).start()
    started = time.monotonic()
    sharedfs.wait_for(later, timeout=5)
    assert 0.25 < time.monotonic() - started < 2
    with pytest.raises(sharedfs.WaitTimeout) as info:
        sharedfs.wait_for(tmp_path / "never", timeout=0.2)
    message = str(info.value)
    assert f"{tmp_path}/never to appear on node" in message and "rank 0 of 1" in message
    assert "SHAREDFS_WAIT_TIMEOUT" in message


def test_auto_cache_moves_only_predictable_shared_tmp_defaults(root: Path, fresh_runtime) -> None:
    from sharedfs.model.policy import CacheRequest

    registry, policy = fresh_runtime.registry(), fresh_runtime.policy()
    assert policy.cache == "auto"
    wids = CacheRequest("wids", "WIDS_CACHE", None, "/tmp/_wids_cache")  # everyone's /tmp
    placed = registry.cache_placement(wids, policy).path
    assert placed == str(root / f"sharedfs-{os.getuid()}" / "job-1234" / "wids")
    assert stat.S_IMODE(os.stat(placed).st_mode) == 0o700
    datasets = CacheRequest("datasets", "HF_DATASETS_CACHE", None, "~/.cache/huggingface/datasets")
    assert registry.cache_placement(datasets, policy).path is None  # ~/.cache is already the user's
    assert registry.cache_placement(wids, fresh_runtime.policy(cache="shared")).path is None

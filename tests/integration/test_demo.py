"""The README's main job: `sharedfs demo` reproduces every field failure and shows it fixed.

CI runs it as users do (the real command, real subprocesses, FUSE filesystems) and
asserts both outcomes of every scenario from --json.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import clean_env

pytestmark = pytest.mark.slow


def demo(*args: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "sharedfs", "demo", "--json", *args], capture_output=True,
                          text=True, env=clean_env(), timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def test_every_scenario_fails_without_sharedfs_and_works_with_it() -> None:
    report = demo()
    assert report["mode"].startswith("FUSE")
    for scenario in report["scenarios"]:
        assert scenario["skipped"] is None, scenario
        assert scenario["without"]["failed"] and not scenario["with_sharedfs"]["failed"], scenario
    evidence = {s["name"]: (s["without"]["evidence"], s["with_sharedfs"]["evidence"]) for s in report["scenarios"]}
    assert "FileSystem does not appear to support flock" in evidence["datasets, Lustre without -o flock (ENOSYS)"][0]
    assert "No locks available" in evidence["datasets, NFS without lockd (ENOLCK)"][0]
    assert "counter 80/80" in evidence["flock that excludes one node only (GPFS, localflock)"][1]
    assert "No locks available" in evidence["wids cache on storage without flock (ENOLCK)"][0]
    duplicates = evidence["8 webdataset readers share one cache_dir"]
    assert "fetches per shard" in duplicates[0] and "fetches per shard: mean 1.0, max 1" in duplicates[1]
    trap = evidence["Dataset from a node-local cache sent to another node"]
    assert "FileNotFoundError" in trap[0] and "NodeLocalDatasetError" in trap[1]


def test_without_fuse_the_preload_fallback_still_demonstrates_the_lock_failures() -> None:
    report = demo("--no-fuse", "--only", "datasets")
    assert report["mode"].startswith("LD_PRELOAD")
    assert [s["fixed"] for s in report["scenarios"]] == [True, True]


@pytest.fixture
def throwaway_user():
    """A fresh unprivileged user who may run this checkout's interpreter, removed afterwards."""
    import os
    import uuid

    if os.geteuid() != 0:
        pytest.fail("creating a throwaway user needs root (CI runs as root)")
    name = f"sfs{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "--create-home", name], check=True)
    # The interpreter may live under a private /root (pyenv): let the user traverse it, nothing more.
    subprocess.run(["setfacl", "-m", f"u:{name}:x", "/root"], check=True)
    try:
        yield name
    finally:
        subprocess.run(["setfacl", "-x", f"u:{name}", "/root"], check=False)
        subprocess.run(["userdel", "--remove", name], check=False, capture_output=True)


def test_a_non_root_user_without_fuse_gets_the_fallbacks(throwaway_user: str) -> None:
    proc = subprocess.run(["runuser", "-u", throwaway_user, "--", sys.executable, "-m", "sharedfs", "demo", "--json",
                           "--no-fuse"], capture_output=True, text=True, env=clean_env(), timeout=900, cwd="/tmp")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["mode"].startswith("LD_PRELOAD")
    ran = [s for s in report["scenarios"] if not s["skipped"]]
    assert {s["name"] for s in ran} == {"datasets, Lustre without -o flock (ENOSYS)",
                                        "datasets, NFS without lockd (ENOLCK)", "lock of a killed job on another node",
                                        "wids cache on storage without flock (ENOLCK)",
                                        "8 webdataset readers share one cache_dir",
                                        "Dataset from a node-local cache sent to another node"}
    assert all(s["fixed"] for s in ran)
    assert all("needs FUSE" in s["skipped"] for s in report["scenarios"] if s["skipped"])

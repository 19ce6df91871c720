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


def test_without_fuse_the_preload_fallback_still_demonstrates_the_lock_failures() -> None:
    report = demo("--no-fuse", "--only", "datasets")
    assert report["mode"].startswith("LD_PRELOAD")
    assert [s["fixed"] for s in report["scenarios"]] == [True, True]

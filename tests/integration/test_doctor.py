"""`sharedfs doctor` on local disk and on each hostile profile: text, warnings and a stable --json schema."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import clean_env

pytestmark = pytest.mark.slow

REPORT_KEYS = {"path", "filesystem", "probes", "lock", "cache", "warnings"}
FS_KEYS = {"mount", "kind", "shared", "flock", "flock_errno", "posix", "posix_errno", "o_excl_atomic",
           "safe_lock", "notes"}
PROBES = ["flock", "flock_excludes", "posix", "posix_excludes", "o_excl", "link", "rename_replace", "fsync"]


def doctor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sharedfs", "doctor", *args], capture_output=True, text=True,
                          env=clean_env())


def doctor_json(path: str) -> dict:
    proc = doctor("--json", path)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    (report,) = data["paths"]
    assert set(report) == REPORT_KEYS and set(report["filesystem"]) == FS_KEYS
    assert list(report["probes"]["results"]) == PROBES
    return report


def test_local_disk_is_healthy(tmp_path: Path) -> None:
    report = doctor_json(str(tmp_path))
    assert report["filesystem"]["kind"] in ("local", "tmpfs", "overlay") and not report["filesystem"]["shared"]
    assert all(result["ok"] for result in report["probes"]["results"].values())
    assert report["lock"]["kind"] == "flock" and report["warnings"] == []
    text = doctor(str(tmp_path)).stdout
    assert "probe flock_excludes ok" in text and "lock       : flock" in text


@pytest.mark.parametrize(("profile", "errno", "symptom"), [
    ("lustre-noflock", "ENOSYS", "FileSystem does not appear to support flock"),
    ("nfs-nolock", "ENOLCK", "No locks available"),
])
def test_flockless_profiles_are_diagnosed_with_the_error_users_see(hostile_mount, profile, errno, symptom) -> None:
    report = doctor_json(hostile_mount(profile).path)
    assert report["probes"]["results"]["flock"]["errno"] == errno
    assert report["probes"]["results"]["posix"]["errno"] == errno
    assert report["probes"]["results"]["o_excl"]["ok"]
    assert report["lock"]["kind"] == "soft"
    assert any(symptom in w and f"fails here with {errno}" in w for w in report["warnings"])


def test_localflock_is_not_trusted_on_a_shared_filesystem(hostile_mount) -> None:
    report = doctor_json(hostile_mount("localflock").path)
    assert report["probes"]["results"]["flock"]["ok"] and report["probes"]["results"]["flock_excludes"]["ok"]
    assert report["filesystem"]["shared"] and report["filesystem"]["safe_lock"] is None
    assert report["lock"]["kind"] == "soft"
    assert any("excludes only processes on the same node" in w for w in report["warnings"])


def test_lagging_profile_and_a_missing_path(hostile_mount) -> None:
    report = doctor_json(hostile_mount("lagging", lag_ms=300).path)
    assert report["probes"]["results"]["rename_replace"]["ok"]
    proc = doctor("/nonexistent/dir")
    assert proc.returncode == 2 and "/nonexistent/dir: no such file or directory" in proc.stderr

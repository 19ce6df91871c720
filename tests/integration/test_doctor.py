"""`sharedfs doctor` on local disk and on each hostile profile: text, warnings and a stable --json schema."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import clean_env

pytestmark = pytest.mark.slow

REPORT_KEYS = {"path", "filesystem", "probes", "lock", "cache", "warnings", "verdict", "conflicts", "team",
               "sharedfs_off", "handover"}
VERDICT_KEYS = {"filesystem", "locks", "across_nodes", "sharedfs", "without_sharedfs", "better"}
FS_KEYS = {"mount", "kind", "shared", "flock", "flock_errno", "posix", "posix_errno", "o_excl_atomic",
           "safe_lock", "notes", "name", "hard_links", "cache_seconds"}
PROBES = ["flock", "flock_excludes", "posix", "posix_excludes", "o_excl", "link", "rename_replace", "fsync"]


def doctor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sharedfs", "doctor", *args], check=False, capture_output=True, text=True,
                          env=clean_env())


def doctor_json(path: str) -> dict:
    proc = doctor("--json", path)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    (report,) = data["paths"]
    assert set(report) == REPORT_KEYS and set(report["filesystem"]) == FS_KEYS and set(report["verdict"]) == VERDICT_KEYS
    assert list(report["probes"]["results"]) == PROBES
    return report


def test_local_disk_is_healthy(tmp_path: Path) -> None:
    report = doctor_json(str(tmp_path))
    assert report["filesystem"]["kind"] in ("local", "tmpfs", "overlay") and not report["filesystem"]["shared"]
    assert all(result["ok"] for result in report["probes"]["results"].values())
    assert report["lock"]["kind"] == "flock" and report["warnings"] == []
    text = doctor(str(tmp_path)).stdout
    assert "probe flock_excludes ok" in text and "  sharedfs   : flock (flock is reliable on local" in text
    assert "  better     : nothing: storage only this node sees" in text
    assert "exclude each other here" in report["verdict"]["without_sharedfs"]


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


def test_mount_options_are_shown_once_each(tmp_path: Path) -> None:
    """The per-mount and superblock option strings both say `rw`; the text merged them into `rw,...,rw,...`."""
    (line,) = [line for line in doctor(str(tmp_path)).stdout.splitlines() if line.startswith("  options    : ")]
    options = line.split(": ", 1)[1].split(",")
    assert len(options) == len(set(options)) and "rw" in options, line


@pytest.mark.parametrize(("profile", "kind"), [("lustre-noflock", "soft"), ("localflock", "soft")])
def test_verdict_says_programs_without_sharedfs_are_not_excluded_by_its_existence_locks(hostile_mount, profile,
                                                                                      kind) -> None:
    mount = hostile_mount(profile)
    report = doctor_json(mount.path)
    verdict = report["verdict"]
    assert report["lock"]["kind"] == kind and verdict["sharedfs"].startswith("existence (soft) locks")
    assert "NOT excluded by sharedfs's existence locks" in verdict["without_sharedfs"]
    assert "python -S" in verdict["without_sharedfs"] and "stock filelock" in verdict["without_sharedfs"]
    assert f"sharedfs doctor --cross-node {mount.path}" in verdict["across_nodes"]
    text = doctor(mount.path).stdout
    assert "  without it : programs without sharedfs" in text and "  better     : " in text
    # One screen: the verdict comes before the evidence, and the whole report fits a terminal.
    lines = text.strip().splitlines()
    assert lines.index(next(line for line in lines if line.startswith("  better"))) < \
        lines.index(next(line for line in lines if line.startswith("  probe ")))
    assert len(lines) <= 24, text


def test_stock_filelock_is_really_not_excluded_where_the_verdict_says_so(hostile_mount) -> None:
    """The verdict's claim, checked: on a flock-less mount a sharedfs holder does not stop stock filelock."""
    mount = hostile_mount("lustre-noflock")
    lock_file = os.path.join(mount.path, "cache.lock")
    code = ("import sys, sharedfs, subprocess\n"
            "with sharedfs.lock(sys.argv[1], timeout=5):\n"
            "    r = subprocess.run([sys.executable, '-c', 'import filelock, sys; "
            "filelock.FileLock(sys.argv[1], timeout=1).acquire(); print(\"stock filelock acquired\")', sys.argv[1]],"
            " check=False, capture_output=True, text=True, env={**__import__('os').environ, 'SHAREDFS_DISABLE': '1'})\n"
            "    print(r.stdout.strip() or r.stderr.strip().splitlines()[-1])\n")
    proc = subprocess.run([sys.executable, "-c", code, lock_file], check=False, capture_output=True, text=True, env=clean_env())
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "stock filelock acquired"  # both "hold" it: what the verdict warns about


def test_conflicting_node_id_is_shown_by_doctor_and_status(tmp_path: Path) -> None:
    env = clean_env({"SHAREDFS_NODE_ID": "n1", "SLURMD_NODENAME": "n2"})
    text = subprocess.run([sys.executable, "-m", "sharedfs", "doctor", str(tmp_path)], check=False, capture_output=True,
                          text=True, env=env).stdout
    assert "CONFLICT node_id: SHAREDFS_NODE_ID='n1' disagrees with SLURMD_NODENAME='n2'" in text
    assert "never uses this node id to declare a lock holder dead" in text
    status = subprocess.run([sys.executable, "-m", "sharedfs", "status"], check=False, capture_output=True, text=True, env=env)
    assert "CONFLICT node_id: SHAREDFS_NODE_ID='n1' disagrees with SLURMD_NODENAME='n2'" in status.stdout
    assert re.search(r"node_id +n1 +\(SHAREDFS_NODE_ID\)  <- CONFLICT", status.stdout), status.stdout

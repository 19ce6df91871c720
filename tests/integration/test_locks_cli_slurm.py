"""``sharedfs locks`` on a real Slurm cluster: a holder whose job Slurm reports ended is dead; a running one held.

The holder runs as a job on node ``n1``; the command runs here (not a node of the cluster, so
this host cannot see the holder's pid) and asks Slurm, exactly as a waiter would.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness.slurm import SlurmCluster
from helpers import clean_env

# xdist_group: one session-wide test Slurm cluster (its 8 CPUs, epilog.d) per group.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm-cluster")]

HOLDER = """
import sys, time, sharedfs
lock = sharedfs.lock(sys.argv[1])  # kept: filelock releases a lock it garbage-collects
lock.acquire()
open(sys.argv[2], "w").close()
time.sleep(3600)
"""


def locks(cluster: SlurmCluster, *args: str, **env: str) -> tuple[list[dict], int]:
    done = subprocess.run([sys.executable, "-m", "sharedfs", "locks", "--json", *args], capture_output=True,
                          text=True, timeout=120,
                          env=clean_env({"SLURM_CONF": str(cluster.conf), "SHAREDFS_NODE_ID": "login", **env}))
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout), done.returncode


def test_a_job_slurm_reports_ended_is_dead_and_cleared(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    lock, held = shared / "dataset.lock", tmp_path / "held"
    holder = tmp_path / "holder.py"
    holder.write_text(HOLDER)
    env = clean_env({"SLURM_CONF": str(slurm_cluster.conf), "SHAREDFS_LOCK": "soft"})
    job = slurm_cluster.sbatch(f"#!/bin/sh\nexec {sys.executable} {holder} {lock} {held}\n", "-w", "n1", "-D",
                               str(tmp_path), env=env)
    deadline = time.monotonic() + 90
    while not held.exists():
        assert time.monotonic() < deadline, slurm_cluster.output(job)
        time.sleep(0.05)

    # Running: held, by Slurm's word.
    (row,), status = locks(slurm_cluster, str(shared))
    assert row["state"] == "held" and row["holder"]["job"] == job and row["holder"]["node"] == "n1", row
    assert f"Slurm reports job {job}.batch as still active" in row["evidence"] and status == 1

    slurm_cluster.run("scancel", job)
    slurm_cluster.wait_finished(job, timeout=30)
    # The failure first: the marker outlives the job, and without the scheduler nobody here can tell.
    assert Path(f"{lock}.held").exists()
    (row,), status = locks(slurm_cluster, str(shared), SHAREDFS_DISABLE="slurm")
    assert row["state"] == "unknown" and "run this command on n1" in row["evidence"] and status == 1

    # With the scheduler: dead (Slurm says the job ended), nothing held, and --clear-dead removes it.
    # (Slurm's answers are shared by the user's processes on a node for a few seconds: the "still
    # active" of a moment ago may be given once more, as to a waiter.)
    deadline = time.monotonic() + 30
    while True:
        (row,), status = locks(slurm_cluster, str(shared))
        if row["state"] != "held" or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert row["state"] == "dead" and f"Slurm reports that job {job}.batch ended" in row["evidence"] and status == 0, row
    (row,), status = locks(slurm_cluster, "--clear-dead", str(shared))
    assert row["cleared"] is True and not Path(f"{lock}.held").exists() and status == 0

"""A real user's multi-step Slurm job on the two-node test cluster: the node-local cache lives as long as the job.

Step 0 prepares a node-local cache on each node and exits; step 1 of the same
job finds it (the last process of step 0 used to remove it); the Slurm epilog
(root, ``sharedfs cleanup --job $SLURM_JOB_ID --uid $SLURM_JOB_UID``) removes
it when the job is over, working as the user: nothing root-owned is ever left
in her directories.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import sysconfig
import tempfile
import textwrap
from pathlib import Path

import pytest
from harness.slurm import SlurmCluster
from helpers import clean_env
from helpers.unixusers import may_run_this_python, owned_by, throwaway_users

import sharedfs

# xdist_group: one session-wide test Slurm cluster (its 8 CPUs, epilog.d) per group.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm-cluster")]

CHECKOUT = str(Path(sharedfs.__file__).resolve().parents[1])
SITE = sysconfig.get_paths()["purelib"]

TASK = """
import json, os, sys
import sharedfs
path = sharedfs.node_local_dir("datasets")
if sys.argv[1] == "prepare":
    (path / "prepared.arrow").write_text("expensive")
print(json.dumps({"step": os.environ["SLURM_STEP_ID"], "node": os.environ["SLURMD_NODENAME"], "dir": str(path),
                  "found": (path / "prepared.arrow").exists(), "uid": os.getuid()}), flush=True)
"""


def test_a_users_multi_step_job_keeps_its_cache_until_the_epilog(slurm_cluster: SlurmCluster) -> None:
    with throwaway_users(1) as (user,):
        base = Path(tempfile.mkdtemp(prefix="sharedfs-steps-", dir="/tmp"))
        try:
            base.chmod(0o755)
            (base / "out").mkdir(mode=0o777)
            (base / "out").chmod(0o777)
            for node in ("n1", "n2"):
                (base / "local" / node).mkdir(parents=True)
                (base / "local" / node).chmod(0o1777)  # each node's /tmp
            task = base / "task.py"
            task.write_text(TASK)
            task.chmod(0o644)
            local = base / "local"
            step = (f"srun -N 2 --ntasks-per-node=1 /bin/sh -c 'SHAREDFS_CACHE_ROOT={local}/$SLURMD_NODENAME "
                    f"exec {sys.executable} {task} {{how}}'")
            script = f"#!/bin/sh\n{step.format(how='prepare')}\n{step.format(how='read')}\n"
            hook = slurm_cluster.root / "epilog.d" / f"sharedfs-steps-{base.name}"
            hook.write_text(textwrap.dedent(f"""\
                #!/bin/sh
                echo "context=$SLURM_SCRIPT_CONTEXT" >> {base}/epilog-$SLURMD_NODENAME.log
                PYTHONPATH={CHECKOUT} {sys.executable} -m sharedfs cleanup --job "$SLURM_JOB_ID" \\
                    --uid "$SLURM_JOB_UID" --root {local}/$SLURMD_NODENAME --json \\
                    >> {base}/epilog-$SLURMD_NODENAME.log 2>&1
                """))
            hook.chmod(0o755)
            env = clean_env({"SLURM_CONF": str(slurm_cluster.conf), "PYTHONPATH": f"{CHECKOUT}:{SITE}"})
            try:
                with may_run_this_python(user, CHECKOUT, SITE):
                    job = slurm_cluster.sbatch(script, "-N", "2", "--ntasks-per-node=1", f"--uid={user.name}",
                                               f"--gid={user.name}", "-D", str(base),
                                               f"--output={base}/out/%j.out", env=env)
                    state = slurm_cluster.wait_finished(job, timeout=120)
            finally:
                hook.unlink()
            output = (base / "out" / f"{job}.out").read_text()
            assert state == "COMPLETED", output
            lines = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
            assert sorted((line["step"], line["node"]) for line in lines) == [
                ("0", "n1"), ("0", "n2"), ("1", "n1"), ("1", "n2")], output
            assert all(line["uid"] == user.uid for line in lines), lines
            for line in lines:
                if line["step"] == "1":
                    assert line["found"], f"step 1 on {line['node']} lost the cache step 0 prepared: {output}"
            # The epilog removed each node's job directory, as the job is over, and left nothing of root's.
            for node in ("n1", "n2"):
                log = (base / f"epilog-{node}.log").read_text()
                user_dir = local / node / f"sharedfs-{user.uid}"
                assert not (user_dir / f"job-{job}").exists(), log
                assert f'"removed": [\n    "{user_dir}/job-{job}"' in log, log
                assert owned_by(0, str(user_dir)) == [], log
                assert "context=epilog_slurmd" in log, log
        finally:
            shutil.rmtree(base, ignore_errors=True)


def test_the_epilog_of_a_killed_job_ignores_its_stale_markers(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """A task killed with SIGKILL leaves its marker; in the job's own epilog that marker cannot hold the directory."""
    local = tmp_path / "local"
    for node in ("n1", "n2"):
        (local / node).mkdir(parents=True, mode=0o755)
    task = tmp_path / "task.py"
    task.write_text(TASK + "os.kill(os.getpid(), 9)\n")
    hook = slurm_cluster.root / "epilog.d" / f"sharedfs-killed-{tmp_path.name}"
    hook.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        PYTHONPATH={CHECKOUT} {sys.executable} -m sharedfs cleanup --job "$SLURM_JOB_ID" \\
            --root {local}/$SLURMD_NODENAME --json >> {tmp_path}/epilog-$SLURMD_NODENAME.log 2>&1
        """))
    hook.chmod(0o755)
    env = clean_env({"SLURM_CONF": str(slurm_cluster.conf), "PYTHONPATH": CHECKOUT})
    script = (f"#!/bin/sh\nsrun -N 2 --ntasks-per-node=1 /bin/sh -c 'SHAREDFS_CACHE_ROOT={local}/$SLURMD_NODENAME "
              f"exec {sys.executable} {task} prepare'\n")
    try:
        job = slurm_cluster.sbatch(script, "-N", "2", "--ntasks-per-node=1", "-D", str(tmp_path), env=env)
        slurm_cluster.wait_finished(job, timeout=120)
    finally:
        hook.unlink()
    for node in ("n1", "n2"):
        log = (tmp_path / f"epilog-{node}.log").read_text()
        assert not (local / node / f"sharedfs-{os.getuid()}" / f"job-{job}").exists(), log
        assert '"live": []' in log, log

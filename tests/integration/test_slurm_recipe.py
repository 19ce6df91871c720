"""The README's Slurm recipe, run as written on the two-node test cluster.

The batch script is the fenced block of README.md that carries the marker
``# sharedfs-recipe: slurm-batch``; ``train.py`` is the user's program: two tasks,
one per node, contend for one existence (soft) lock.  Rank 0 on ``n1`` holds it
for a few seconds; rank 1 on ``n2`` must wait for it, never take it while rank 0
lives.

Real nodes have PID spaces of their own; the test cluster's fake nodes share
this machine's.  So ``python`` on the job's PATH first enters a new PID namespace
(with ``/proc`` mounted for it), where the task's pid is one the other node's
namespace does not have -- exactly what a waiter on another node sees.

The failure first: the recipe as it was when ``sharedfs env`` exported
``SHAREDFS_NODE_ID`` (the batch node's name, handed by srun to both tasks), with
the liveness rule of that time (same node name, pid not running here, so dead;
installed as a third-party plugin over the built-in one).  The waiter then takes
the live holder's lock.  The same old recipe under today's rule (same node name
AND same boot AND same PID namespace, and never a node id that contradicts
Slurm) does not break it, and each task's ``sharedfs status --json`` reports the
exported node id as a conflict.  The README's recipe exports no node id at all.
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
from pathlib import Path

import pytest
from harness.slurm import SlurmCluster
from helpers import clean_env

# xdist_group: one session-wide test Slurm cluster (its 8 CPUs, epilog.d) per group.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm-cluster")]

ROOT = Path(__file__).resolve().parents[2]
MARKER = "# sharedfs-recipe: slurm-batch"
HOLD_SECONDS = 6.0

TRAIN = """
import json, os, subprocess, sys, time
import sharedfs

rank = int(os.environ["SLURM_PROCID"])
shared = os.path.abspath("shared")
out = {"rank": rank, "slurm_node": os.environ["SLURMD_NODENAME"], "pid": os.getpid(),
       "node_id": sharedfs.policy().node_id}
lock = sharedfs.lock(os.path.join(shared, "train.lock"))
if rank == 0:
    lock.acquire()
    out["acquired_at"] = time.time()
    open(os.path.join(shared, "held"), "w").close()
    time.sleep(float(os.environ["HOLD_SECONDS"]))
    out["released_at"] = time.time()  # before the release: a waiter that waited acquires after this
    lock.release()
else:
    while not os.path.exists(os.path.join(shared, "held")):
        time.sleep(0.02)
    status = subprocess.run(["sharedfs", "status", "--json"], capture_output=True, text=True, check=True)
    out["status"] = json.loads(status.stdout)
    lock.acquire(timeout=60)
    out["acquired_at"] = time.time()
    lock.release()
with open(os.path.join("results", f"rank{rank}.json"), "w") as fh:
    json.dump(out, fh)
"""

#: ``python`` on the job's PATH: a PID namespace of its own per task (see the module docstring).  The
#: task's pid is set high and per rank, so neither task's pid exists in the other's namespace.
PYTHON_WRAPPER = """#!/bin/sh
exec unshare --pid --fork --mount-proc -- /bin/sh -c '
echo $(( $(cat /proc/sys/kernel/pid_max) - 1000 + 100 * ${{SLURM_PROCID:-0}} )) > /proc/sys/kernel/ns_last_pid
"$0" "$@" & wait $!' {python} "$@"
"""

#: The liveness rule before holder records carried the boot id and PID namespace, as it was.
OLD_LIVENESS = '''
"""The old liveness rule: a holder whose record names this node is dead when its pid is not running here."""
import os

from sharedfs.machinery.hookspecs import hookimpl
from sharedfs.model.records import process_start_time


@hookimpl(tryfirst=True)
def sharedfs_holder_alive(record, policy):
    if record.node != policy.node_id:
        return None
    try:
        os.kill(record.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    started = process_start_time(record.pid)
    if record.start_time and started and started != record.start_time:
        return False
    return True
'''


def readme_recipe() -> str:
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)
    (recipe,) = [block for block in blocks if MARKER in block]
    return recipe


def old_recipe() -> str:
    """The recipe when `sharedfs env` still exported the node id: in a batch script, the batch node's name."""
    recipe = readme_recipe()
    line = next(line for line in recipe.splitlines() if line.startswith('eval "$exports"'))
    return recipe.replace(line, line + '\nexport SHAREDFS_NODE_ID="$SLURMD_NODENAME"  # what sharedfs env printed')


def old_rule_plugin(directory: Path) -> Path:
    """A third-party plugin (entry point group ``sharedfs``) with the old rule; PYTHONPATH finds it."""
    directory.mkdir()
    (directory / "old_liveness.py").write_text(textwrap.dedent(OLD_LIVENESS))
    meta = directory / "old_liveness-0.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: old-liveness\nVersion: 0\n")
    (meta / "entry_points.txt").write_text("[sharedfs]\nold_liveness = old_liveness\n")
    return directory


def run_recipe(cluster: SlurmCluster, tmp_path: Path, name: str, script: str, **extra: str) -> dict[int, dict]:
    work = tmp_path / name
    for sub in ("shared", "results", "bin", "local"):
        (work / sub).mkdir(parents=True)
    (work / "train.py").write_text(textwrap.dedent(TRAIN))
    wrapper = work / "bin" / "python"
    wrapper.write_text(PYTHON_WRAPPER.format(python=sys.executable))
    wrapper.chmod(0o755)
    env = clean_env({
        "SLURM_CONF": str(cluster.conf),
        "PATH": f"{work / 'bin'}:{Path(sys.executable).parent}:/usr/sbin:/usr/bin:/sbin:/bin",
        "TMPDIR": str(work / "local"),  # node-local directories of `sharedfs env` stay in the test's dir
        "SHAREDFS_LOCK": "soft",  # a site policy for a flock-less filesystem: an existence lock
        "HOLD_SECONDS": str(HOLD_SECONDS),
        **extra,
    })
    job = cluster.sbatch(script, "-D", str(work), env=env)
    state = cluster.wait_finished(job, timeout=120)
    assert state == "COMPLETED", f"{state}\n{cluster.output(job)}"
    results = {int(p.stem[4:]): json.loads(p.read_text()) for p in (work / "results").glob("rank*.json")}
    assert sorted(results) == [0, 1], cluster.output(job)
    assert (results[0]["slurm_node"], results[1]["slurm_node"]) == ("n1", "n2"), results
    return results


def broke_the_live_lock(results: dict[int, dict]) -> bool:
    return results[1]["acquired_at"] < results[0]["released_at"]


def test_old_recipe_and_old_rule_break_a_live_lock(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """The failure: both tasks call themselves n1, and n2's waiter finds no such pid, so 'dead'."""
    plugin = old_rule_plugin(tmp_path / "plugin")
    results = run_recipe(slurm_cluster, tmp_path, "old-rule", old_recipe(), PYTHONPATH=str(plugin),
                         SHAREDFS_DISABLE="liveness")
    status = results[1]["status"]
    assert [p["name"] for p in status["external_plugins"]] == ["old_liveness"], status["external_plugins"]
    assert status["external_plugins"][0]["error"] is None
    assert (results[0]["node_id"], results[1]["node_id"]) == ("n1", "n1")  # srun handed n1 to both
    assert broke_the_live_lock(results), results
    overlap = results[0]["released_at"] - results[1]["acquired_at"]
    print(f"old recipe + old rule: n2 took n1's live lock {overlap:.1f} s before n1 released it")


def test_old_recipe_under_todays_rule_waits_and_reports_the_conflict(slurm_cluster: SlurmCluster,
                                                                      tmp_path: Path) -> None:
    results = run_recipe(slurm_cluster, tmp_path, "old-recipe", old_recipe())
    assert not broke_the_live_lock(results), results
    conflicts = results[1]["status"]["conflicts"]
    assert conflicts == {"node_id": "SHAREDFS_NODE_ID='n1' disagrees with SLURMD_NODENAME='n2'"}, conflicts


def test_readme_recipe_the_waiter_waits_for_the_live_holder(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    results = run_recipe(slurm_cluster, tmp_path, "readme", readme_recipe())
    assert not broke_the_live_lock(results), results
    assert (results[0]["node_id"], results[1]["node_id"]) == ("n1", "n2")
    assert results[1]["status"]["conflicts"] == {}
    assert results[1]["status"]["policy"]["node_id"] == {"value": "n2", "source": "SLURMD_NODENAME"}
    waited = results[1]["acquired_at"] - results[0]["acquired_at"]
    assert waited >= HOLD_SECONDS * 0.9, results  # it waited for the holder, about as long as it held

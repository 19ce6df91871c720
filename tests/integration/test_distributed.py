"""Collectives on a real torch.distributed gloo group: 4 ranks as 2 simulated nodes.

Ranks are separate interpreters started with torchrun's variables (env://), each
with its node's SHAREDFS_NODE_ID in its environment from exec time, which is what
the FUSE filesystem reads to decide which node a caller is on.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import clean_env

from sharedfs.demo.ports import free_port

pytestmark = pytest.mark.slow

RANK = textwrap.dedent("""
    import json, os, sys, time
    import torch.distributed as dist
    import sharedfs
    from sharedfs.machinery.runtime import identity

    dist.init_process_group("gloo", init_method="env://")
    scenario, base = sys.argv[1], sys.argv[2]
    out = {"rank": dist.get_rank()}
    if scenario == "naive":  # what training scripts do today: rank 0 creates, barrier, everyone uses it
        path = os.path.join(base, "checkpoints", "run1")
        if dist.get_rank() == 0:
            os.makedirs(path, exist_ok=True)
        dist.barrier()
        out["visible"] = os.path.isdir(path)
    elif scenario == "makedirs":
        path = sharedfs.makedirs(os.path.join(base, "checkpoints", "run1"), barrier=True)
        out["visible"] = os.path.isdir(path)
    elif scenario == "first":
        with sharedfs.main_process_first(per_node=sys.argv[3] == "node") as leader:
            out["leader"] = leader
            out["enter"] = time.time()
            time.sleep(0.3)
            out["exit"] = time.time()
    out["identity"] = identity().as_dict()
    dist.destroy_process_group()
    print(json.dumps(out))
""")


def launch(scenario: str, base: Path, *args: str, env: dict[str, str] | None = None) -> list[dict]:
    port = str(free_port())
    procs = []
    for rank in range(4):
        node, local = ("nodeA", rank) if rank < 2 else ("nodeB", rank - 2)
        rank_env = clean_env({
            "RANK": str(rank), "WORLD_SIZE": "4", "LOCAL_RANK": str(local), "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "SHAREDFS_NODE_ID": node,
            "SHAREDFS_WAIT_TIMEOUT": "60", **(env or {}),
        })
        procs.append(subprocess.Popen([sys.executable, "-c", RANK, scenario, str(base), *args],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=rank_env))
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    return sorted(results, key=lambda r: r["rank"])


def test_collective_makedirs_on_a_lagging_filesystem(hostile_mount) -> None:
    mount = hostile_mount("lagging", lag_ms=1500)
    naive = launch("naive", Path(mount.path) / "naive")
    assert [r["visible"] for r in naive] == [True, True, False, False]  # node B cannot see it yet
    results = launch("makedirs", Path(mount.path))
    assert [r["visible"] for r in results] == [True] * 4
    ident = {r["rank"]: r["identity"] for r in results}
    assert ident[3] == {"rank": 3, "world_size": 4, "local_rank": 1, "local_world_size": 2, "node_id": "nodeB",
                        "source": "torch.distributed"}


@pytest.mark.parametrize(("scope", "leaders"), [("global", {0}), ("node", {0, 2})])
def test_main_process_first_orders_leaders_before_followers(tmp_path: Path, scope: str, leaders: set) -> None:
    results = launch("first", tmp_path, scope)
    assert {r["rank"] for r in results if r["leader"]} == leaders
    last_leader_exit = max(r["exit"] for r in results if r["leader"])
    assert all(r["enter"] >= last_leader_exit for r in results if not r["leader"])


def test_a_barrier_without_a_process_group_says_what_to_do() -> None:
    proc = subprocess.run([sys.executable, "-c", "from sharedfs.cluster.dist import barrier; barrier()"],
                          capture_output=True, text=True, env=clean_env({"RANK": "1", "WORLD_SIZE": "4"}))
    assert proc.returncode == 1
    assert "a barrier needs an initialised torch.distributed process group, but this process is rank 1 of 4" \
        in proc.stderr
    assert "init_process_group()" in proc.stderr

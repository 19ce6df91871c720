"""Real OLMo (ai2-olmo 0.6.0): six ranks on three simulated nodes prepare a checkpoint directory on a lagging filesystem.

User story (OLMo#829): OLMo's checkpointers save through ``Checkpointer._temporary_wd``:
the filesystem's local rank 0 makes ``<dir>-tmp`` and every rank waits a fixed
10 s (``olmo.util.wait_for(lambda: checkpoint_dir_tmp.exists(), ...)``) until it
sees it; after the save, rank 0 renames it to ``<dir>`` and every rank waits for
that too.  Attribute and negative-lookup caches hide both from the other nodes
for longer.  The job sets ``OLMO_SHARED_FS=1``, OLMo's own switch for a shared
filesystem (one creator), so the fixed wait is what is tested.

The ranks run OLMo's own code (``tests/helpers/olmoworker.py``, no sharedfs call)
in the pinned OLMo venv (ai2-olmo pins ai2-olmo-core 0.1.0 and numpy<2: a venv of
its own, built once under ``SHAREDFS_TEST_VENV_CACHE``), joined over gloo, on a
hostilefs ``lagging`` mount that hides a new entry from the other nodes for 14 s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
from helpers import HELPERS, Venv, clean_env

from sharedfs.demo.frameworkvenv import cached_venv, install_sharedfs
from sharedfs.demo.hostilefs import HostileMount
from sharedfs.demo.olmo_core_job import run_job, summary

pytestmark = pytest.mark.slow

#: Longer than OLMo's fixed 10 s, shorter than sharedfs's default budget (SHAREDFS_WAIT_TIMEOUT, 300 s).
LAG_MS = 14_000
JOB_ENV = {"OMP_NUM_THREADS": "1", "OLMO_SHARED_FS": "1"}
#: One rank: OLMo's checkpointer's temporary-directory dance, run by path in the OLMo venv.
OLMO_RANK_PROGRAM = HELPERS / "olmoworker.py"
#: The OLMo (ai2-olmo 0.6.0) stack: a venv of its own, as it pins ai2-olmo-core 0.1.0 and numpy<2.
OLMO_REQUIREMENTS = HELPERS / "olmo_requirements.txt"


@pytest.fixture(scope="session")
def olmo_env(sharedfs_wheel: Path) -> Venv:
    """The pinned OLMo stack (built once per requirements file) with this sharedfs wheel."""
    root = cached_venv("olmo", OLMO_REQUIREMENTS)
    install_sharedfs(root, sharedfs_wheel)
    return Venv(root)


def _job(venv: Venv, mount: HostileMount, tmp_path: Path, name: str, **env: str) -> list[dict[str, Any]]:
    reports = run_job(venv.python, Path(mount.path) / name, clean_env({**JOB_ENV, **env}),
                      local_root=tmp_path / f"node-local-{name}", program=OLMO_RANK_PROGRAM)
    for r in reports:
        print(r["rank"], r.get("node"), r["ok"], r.get("seconds"), r["error"])
    return reports


@pytest.mark.long
def test_other_nodes_time_out_without_sharedfs_and_all_get_through_with_it(
        olmo_env: Venv, hostile_mount: Callable[..., HostileMount], tmp_path: Path) -> None:
    mount = hostile_mount("lagging", lag_ms=LAG_MS)

    stock = _job(olmo_env, mount, tmp_path, "stock", SHAREDFS_DISABLE="1")
    print("without sharedfs:", summary(stock))
    timed_out = {r["rank"] for r in stock
                 if str(r["error"]).startswith("TimeoutError: Waiting for checkpoint directory timed out")}
    assert timed_out == {2, 3, 4, 5}, summary(stock)  # nodes n1 and n2; node n0 made it and sees it
    assert not (Path(mount.backing) / "stock").exists()

    fixed = _job(olmo_env, mount, tmp_path, "sharedfs")
    print("with sharedfs:", summary(fixed))
    assert [r["ok"] for r in fixed] == [True] * 6, summary(fixed) + "\n" + fixed[-1]["stderr"][-3000:]
    # Both waits (the temporary directory, then the renamed one) outlasted OLMo's 10 s on the other nodes.
    assert max(r["seconds"] for r in fixed if r["node"] != "n0") > 10, fixed
    assert sorted(p.name for p in (Path(mount.backing) / "sharedfs").iterdir()) == [f"rank{i}.txt" for i in range(6)]


PROGRAM = """
from pathlib import Path
from olmo.util import wait_for

def wait(checkpoint_dir):  # as in olmo.checkpoint: the lambda closes over a local Path
    wait_for(lambda: checkpoint_dir.exists(), "Waiting for checkpoint directory", timeout=1.0)

try:
    wait(Path(NEVER))
except TimeoutError as exc:
    print(type(exc).__name__, isinstance(exc, TimeoutError), exc, sep="|")
"""


def test_the_timeout_names_the_path_the_node_the_filesystem_and_the_setting(
        olmo_env: Venv, hostile_mount: Callable[..., HostileMount]) -> None:
    mount = hostile_mount("lagging", lag_ms=LAG_MS)
    never = str(Path(mount.path) / "never-made")
    program = PROGRAM.replace("NEVER", repr(never))
    env = {"SHAREDFS_NODE_ID": "n1", "SHAREDFS_WAIT_TIMEOUT": "3"}

    stock = olmo_env.run(program, env={**env, "SHAREDFS_DISABLE": "1"}).stdout.strip()
    assert stock == "TimeoutError|True|Waiting for checkpoint directory timed out"  # not which, where or why

    name, is_timeout, message = olmo_env.run(program, env=env).stdout.strip().split("|", 2)
    assert is_timeout == "True"
    assert message.startswith(f"Waiting for checkpoint directory timed out: waited 3.0 s for {never}"), message
    for part in ("node n1", "fuse.hostilefs", str(mount.path), "SHAREDFS_WAIT_TIMEOUT"):
        assert part in message, (part, message)


def test_disable_olmo_leaves_it_stock(olmo_env: Venv) -> None:
    code = """
import olmo.util as u, olmo.checkpoint as c
print(u.wait_for.__code__.co_filename == u.__file__, c.wait_for is u.wait_for)
"""
    assert olmo_env.run(code, env={"SHAREDFS_DISABLE": "olmo"}).stdout.split() == ["True", "True"]
    assert olmo_env.run(code).stdout.split() == ["False", "True"]

"""Real OLMo-core 3.0.0: six ranks on three simulated nodes save a checkpoint on a filesystem that shows new entries late.

User story (OLMo#829, OLMo#894): an OLMo-core job saves a checkpoint to NFS.
``save_state_dict`` prepares the directory: the filesystem's local rank 0 creates
it and every rank waits a fixed 10 s (``olmo_core.utils.wait_for``) until it sees
it.  Attribute and negative-lookup caches hide it from the other nodes for
longer, and those ranks die with ``TimeoutError``; and since OLMo-core treats
each node as its own filesystem unless ``OLMO_SHARED_FS=1``, each node's local
rank 0 creates the same directory, and a node whose cache still hides the
first one gets ``FileExistsError`` from ``mkdir(exist_ok=True)``.

The ranks run OLMo-core's own code unchanged (:mod:`sharedfs.demo.olmo_core_rank`,
no sharedfs call) in the pinned OLMo-core venv (:mod:`sharedfs.demo.frameworkvenv`:
built once under ``SHAREDFS_TEST_VENV_CACHE``, default ``/var/tmp/sharedfs-test-venvs``),
joined over gloo, on a hostilefs ``lagging`` mount that hides a new entry from the
other nodes for 18 s (both scaled by 0.3: :data:`TIME_SCALE`): first with ``SHAREDFS_DISABLE=1``, then with sharedfs's autoload.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
from helpers import Venv, clean_env

from sharedfs.demo.frameworkvenv import install_sharedfs
from sharedfs.demo.hostilefs import HostileMount
from sharedfs.demo.olmo_core_job import olmo_core_venv, run_job, summary

# xdist_group: the OLMo-core venv, into which the demo installs this checkout and these tests the wheel.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("olmo-core-venv")]

#: The ranks scale OLMo-core's fixed 10 s wait by this (JOB_TIME_SCALE, sharedfs.demo.olmo_core_rank), and the
#: lag is scaled with it: the same race, in a third of the time.
TIME_SCALE = 0.3
OLMO_WAIT_S = 10 * TIME_SCALE
#: 1.8 times OLMo-core's wait (2.4 s more: rank start-up jitter on a busy machine), far below sharedfs's
#: default budget (SHAREDFS_WAIT_TIMEOUT, 300 s).
LAG_MS = int(18_000 * TIME_SCALE)
QUIET = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture(scope="session")
def olmo_core_env(sharedfs_wheel: Path) -> Venv:
    """The pinned OLMo-core stack (built once per requirements file) with this sharedfs wheel."""
    root = olmo_core_venv()
    install_sharedfs(root, sharedfs_wheel)
    return Venv(root)


def _job(venv: Venv, mount: HostileMount, tmp_path: Path, name: str, **env: str) -> list[dict[str, Any]]:
    reports = run_job(venv.python, Path(mount.path) / name, clean_env({**QUIET, "JOB_TIME_SCALE": str(TIME_SCALE), **env}),
                      local_root=tmp_path / f"node-local-{name}")
    for r in reports:
        print(r["rank"], r.get("node"), r["ok"], r.get("seconds"), r["error"])
    return reports


def _timeouts(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in reports if not r["ok"] and str(r["error"]).startswith("TimeoutError: timed out Waiting on")]


def test_ranks_of_other_nodes_time_out_without_sharedfs_and_all_save_with_it(
        olmo_core_env: Venv, hostile_mount: Callable[..., HostileMount], tmp_path: Path) -> None:
    """The user's job as written: OLMO_SHARED_FS unset, OLMo-core's defaults."""
    mount = hostile_mount("lagging", lag_ms=LAG_MS)

    stock = _job(olmo_core_env, mount, tmp_path, "stock", SHAREDFS_DISABLE="1")
    print("without sharedfs:", summary(stock))
    # Each node's local rank 0 creates the directory: one wins, the other two get FileExistsError (the name
    # exists but is still hidden from them); their nodes' other ranks time out after OLMo-core's fixed 10 s;
    # the winning node's ranks then lose their peers in the save's collectives.  No rank saves.
    assert not any(r["ok"] for r in stock), summary(stock)
    losers = [r for r in stock if str(r["error"]).startswith("FileExistsError")]
    assert len(losers) == 2 and all(r["rank"] % 2 == 0 for r in losers), summary(stock)
    assert sorted(r["rank"] for r in _timeouts(stock)) == sorted(r["rank"] + 1 for r in losers), summary(stock)
    assert all(r["olmo_shared_fs_after"] is None for r in stock), "stock OLMo-core set OLMO_SHARED_FS itself?"

    fixed = _job(olmo_core_env, mount, tmp_path, "sharedfs")
    print("with sharedfs:", summary(fixed))
    assert [r["ok"] for r in fixed] == [True] * 6, summary(fixed) + "\n" + fixed[-1]["stderr"][-3000:]
    assert all(r["olmo_shared_fs_after"] == "1" for r in fixed)
    # The other nodes waited out the lag instead of giving up at OLMo-core's (scaled) fixed wait.
    assert max(r["seconds"] for r in fixed if r["node"] != "n0") > OLMO_WAIT_S, fixed
    assert (Path(mount.backing) / "sharedfs" / ".metadata").is_file()


def test_with_olmo_shared_fs_set_the_fixed_wait_is_what_fails(
        olmo_core_env: Venv, hostile_mount: Callable[..., HostileMount], tmp_path: Path) -> None:
    """OLMo-core's own advice for shared filesystems: OLMO_SHARED_FS=1, one creator; the 10 s wait is left."""
    mount = hostile_mount("lagging", lag_ms=LAG_MS)

    stock = _job(olmo_core_env, mount, tmp_path, "stock", SHAREDFS_DISABLE="1", OLMO_SHARED_FS="1")
    print("without sharedfs:", summary(stock))
    assert {r["rank"] for r in _timeouts(stock)} == {2, 3, 4, 5}, summary(stock)

    fixed = _job(olmo_core_env, mount, tmp_path, "sharedfs", OLMO_SHARED_FS="1")
    print("with sharedfs:", summary(fixed))
    assert [r["ok"] for r in fixed] == [True] * 6, summary(fixed) + "\n" + fixed[-1]["stderr"][-3000:]
    assert "OLMO_SHARED_FS=1 for this process" not in "".join(r["stderr"] for r in fixed)  # the user's, not ours


SINGLE = """
import os, sys
from pathlib import Path
from olmo_core.utils import wait_for
try:
    wait_for(Path(sys.argv[1]).exists, description=f"Waiting on '{sys.argv[1]}' to be created...", timeout=1.0)
except TimeoutError as exc:
    print(type(exc).__name__, isinstance(exc, TimeoutError), exc, sep="|")
"""


def test_the_timeout_names_the_path_the_node_the_filesystem_and_the_setting(
        olmo_core_env: Venv, hostile_mount: Callable[..., HostileMount]) -> None:
    mount = hostile_mount("lagging", lag_ms=LAG_MS)
    never = str(Path(mount.path) / "never-made")
    env = {"SHAREDFS_NODE_ID": "n1", "SHAREDFS_WAIT_TIMEOUT": "3"}

    program = SINGLE.replace("sys.argv[1]", repr(never))
    stock = olmo_core_env.run(program, env={**env, "SHAREDFS_DISABLE": "1"}).stdout.strip()
    name, is_timeout, message = stock.split("|", 2)
    assert (name, is_timeout) == ("TimeoutError", "True")
    assert message == f"timed out Waiting on '{never}' to be created..."  # nothing about where or why

    out = olmo_core_env.run(program, env=env).stdout.strip()
    name, is_timeout, message = out.split("|", 2)
    assert is_timeout == "True"  # OLMo-core's callers catch TimeoutError: still one
    assert message.startswith(f"timed out Waiting on '{never}' to be created...: waited 3.0 s for {never}"), message
    for part in ("node n1", "fuse.hostilefs", str(mount.path), "SHAREDFS_WAIT_TIMEOUT"):
        assert part in message, (part, message)


PREPARE = """
import os, sys
from olmo_core.distributed.checkpoint import save_state_dict
import torch
save_state_dict(sys.argv[1], {"w": torch.zeros(2)})
print(os.environ.get("OLMO_SHARED_FS"))
"""


@pytest.mark.parametrize("users", [None, "0", "1"])
def test_olmo_shared_fs_follows_the_classification_and_never_overrides_the_user(
        olmo_core_env: Venv, hostile_mount: Callable[..., HostileMount], users: str | None) -> None:
    mount = hostile_mount("plain")
    env = {} if users is None else {"OLMO_SHARED_FS": users}
    stock = olmo_core_env.run(PREPARE.replace("sys.argv[1]", repr(str(Path(mount.path) / "stock"))),
                              env={**env, "SHAREDFS_DISABLE": "olmo_core"})
    assert stock.stdout.strip() == str(users), "SHAREDFS_DISABLE=olmo_core leaves OLMo-core stock"
    proc = olmo_core_env.run(PREPARE.replace("sys.argv[1]", repr(str(Path(mount.path) / "ours"))),
                             env={**env, "SHAREDFS_LOG": "info"})
    assert proc.stdout.strip() == (users or "1"), proc.stderr
    said = "OLMO_SHARED_FS=1 for this process: checkpoint directory" in proc.stderr
    assert said == (users is None), proc.stderr


def test_disable_olmo_core_leaves_every_olmo_core_module_stock(olmo_core_env: Venv) -> None:
    code = """
import olmo_core.utils as u, olmo_core.distributed.checkpoint as c, olmo_core.train.checkpoint as t
print(u.wait_for.__code__.co_filename == u.__file__, c.wait_for is u.wait_for, t.wait_for is u.wait_for,
      c._prepare_env_for_save.__code__.co_filename == c.__file__,
      t.Checkpointer._prepare_dir.__code__.co_filename == t.__file__)
"""
    assert olmo_core_env.run(code, env={"SHAREDFS_DISABLE": "olmo_core"}).stdout.split() == ["True"] * 5
    assert olmo_core_env.run(code).stdout.split() == ["False", "True", "True", "False", "False"]

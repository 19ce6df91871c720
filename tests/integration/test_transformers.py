"""The transformers shim: remote-code modules (``trust_remote_code=True``) on a shared filesystem.

Real transformers (scripts/requirements-test.txt), real processes, an offline hub cache built
by the test (``sharedfs/demo/remotecode.py``: a model whose ``config.json`` maps ``AutoConfig`` to a
~115 kB module with a relative import); the user's code is ``AutoConfig.from_pretrained(repo,
trust_remote_code=True)`` and nothing else.

* A lab's ``HF_HOME`` (2775, its group) used by two real users under umask 022: stock, the second
  user's first model of the same organisation fails with ``PermissionError: [Errno 13]`` on
  ``transformers_modules/<org>/<name>`` (the first user's ``<org>/`` is 2755); with sharedfs both
  load theirs and each other's, and what they made in ``HF_MODULES_CACHE`` is the group's (directories
  it may add to, sticky; files it may read, never write).
* 12 ranks on 3 simulated nodes load a model, 100 ms apart, from a ``HF_MODULES_CACHE`` on hostilefs
  ``nfs-cto+lagging`` (NFS: a node sees a file's data once its writer closed it; a new name
  reaches other nodes after a lag).  With sharedfs as it was before this shim
  (``SHAREDFS_DISABLE=transformers``; ``SHAREDFS_DISABLE=1`` fails earlier, with
  ``FileExistsError`` from ``os.makedirs``) ranks import a module another rank is still
  writing: ``AttributeError: module 'transformers_modules....' has no attribute
  'RemoteConfig'`` (transformers#22555, TensorRT-LLM PR #17708); with the shim, no rank fails.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

# Fixtures; tests/conftest.py also loads the plugin, this keeps the file runnable alone.
from harness.plugin import hostile_mount  # noqa: F401
from helpers import ranks as ranks_helper
from helpers import require
from helpers.shardcache_support import group_of_users, scratch

from sharedfs.demo import node_env, remotecode  # remotecode is also each rank's program

require("transformers", "needs transformers==5.25.0 (scripts/requirements-test.txt)")

pytestmark = pytest.mark.slow

RANK = ["-m", "sharedfs.demo.remotecode"]
LOAD = """
import json, sys
from transformers import AutoConfig
out = {}
for repo in sys.argv[1:]:
    try:
        out[repo] = f"ok {AutoConfig.from_pretrained(repo, trust_remote_code=True).hidden_size}"
    except Exception as exc:
        out[repo] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


def offline(hub: Path, **extra: str) -> dict[str, str]:
    return {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub), "HF_HUB_DISABLE_TELEMETRY": "1",
            "TRANSFORMERS_VERBOSITY": "error", **extra}


# -- the shim itself -------------------------------------------------------------------------------------

PATCHED = """
import json, shutil, sys
import sharedfs, transformers.dynamic_module_utils as d, transformers.generation.utils as g
def seen():
    return [d.shutil is shutil, "modulecache" in d.get_cached_module_file.__code__.co_filename,
            g.get_cached_module_file is d.get_cached_module_file]
out = [seen()]
sharedfs.disable()
out.append(seen())
sharedfs.enable()
out.append(seen())
print(json.dumps(out))
"""


def test_applied_on_the_dynamic_module_import_reversible_and_blocked_by_name(tmp_path: Path) -> None:
    def run(code: str, **env: str) -> str:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "HF_HOME": str(tmp_path), "SHAREDFS_STRICT": "1", **env})
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout

    patched, stock = [False, True, True], [True, False, True]
    assert json.loads(run(PATCHED)) == [patched, stock, patched]
    assert json.loads(run(PATCHED, SHAREDFS_DISABLE="transformers"))[0] == stock
    status = json.loads(run("import transformers.dynamic_module_utils, sharedfs.commands.cli as c;"
                            "c.main(['status', '--json'])"))
    row = next(s for s in status["shims"] if s["name"] == "transformers")
    assert row["applied"] and any("get_cached_module_file" in p for p in row["patches"]), row


# -- a team's HF_HOME ------------------------------------------------------------------------------------


def test_second_member_of_a_team_hf_home_fails_stock_and_loads_with_sharedfs() -> None:
    with scratch("sharedfs-remote-code-") as root, group_of_users(2, root) as (alice, bob):
        hub = root / "hub"
        for repo in ("acc/a", "acc/b"):
            remotecode.make_repo(hub, repo)
        for path in (hub, *hub.rglob("*")):
            path.chmod(0o755 if path.is_dir() else 0o644)

        def run(label: str, disable: str | None) -> tuple[list[dict[str, str]], Path]:
            home = root / label
            home.mkdir()
            os.chown(home, 0, alice.group)
            home.chmod(0o2775)
            env = offline(hub, HF_HOME=str(home), **({"SHAREDFS_DISABLE": disable} if disable else {}))
            outcomes = []
            for user, repos in ((alice, ["acc/a"]), (bob, ["acc/b", "acc/a"]), (alice, ["acc/b"])):
                proc = user.run([sys.executable, "-c", LOAD, *repos], env=env, umask=0o022, timeout=240)
                assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr[-3000:]
                outcomes.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            return outcomes, home / "modules"

        stock, _ = run("stock", "1")
        assert stock[0] == {"acc/a": "ok 19"}
        assert stock[1]["acc/b"].startswith("PermissionError: [Errno 13] Permission denied"), stock[1]
        assert "transformers_modules/acc/b" in stock[1]["acc/b"]

        shared, modules = run("sharedfs", None)
        assert shared == [{"acc/a": "ok 19"}, {"acc/b": "ok 19", "acc/a": "ok 19"}, {"acc/b": "ok 19"}]
        keeping_out = []
        # modules/ itself is on sys.path: the group reads it but adds nothing there (the frameworks' packages are made)
        root = modules.lstat()
        assert root.st_gid == alice.group and root.st_mode & 0o2750 == 0o2750 and not root.st_mode & 0o022, oct(root.st_mode)
        for path in modules.rglob("*"):
            st = path.lstat()
            # members add to every directory, but only an entry's owner changes it: code is read-only to others
            need = stat.S_IRWXG | stat.S_ISGID | stat.S_ISVTX if path.is_dir() else stat.S_IRGRP
            never = 0 if path.is_dir() else stat.S_IWGRP | stat.S_IWOTH
            if st.st_gid != alice.group or st.st_mode & need != need or st.st_mode & never:
                keeping_out.append(f"{path.relative_to(modules)} {oct(stat.S_IMODE(st.st_mode))} gid {st.st_gid}")
        assert not keeping_out, keeping_out
        modules_py = sorted(p.name for p in modules.rglob("*.py") if "__pycache__" not in p.parts)
        assert modules_py.count("configuration_remote.py") == 2 and modules_py.count("helpers.py") == 2
        assert not [p for p in modules.rglob(".*.tmp")], "a temporary file was left behind"


# -- 12 ranks on 3 nodes ---------------------------------------------------------------------------------

NODES = ("a", "b", "c") * 4
#: NFS sends a written file's data at close, which takes this long here: a wide window, as on a busy server.
FLUSH_MS = 400
LAG_MS = 1000
#: Rank i starts each load i * STAGGER_MS after the go (ranks of a job arrive one after another): a rank of a
#: node that copied the module first then imports it while a later rank of another node, which does not see
#: the new name yet, copies it again over it (an O_TRUNC open: every node reads it empty until that close).
STAGGER_MS = 100
TRIALS = 3
#: At most this many batches of TRIALS for the stock side to show the race.
BATCHES = 3


def load_on_nodes(mount_path: Path, backing: Path, hub: Path, sync: Path, repos: list[str],
                  disable: str) -> list[dict[str, object]]:
    """Start 12 ranks, then start each trial's load on all of them at once; every rank's results."""
    env = offline(hub, HF_HOME=str(backing / "home"), HF_MODULES_CACHE=str(mount_path / "modules"),
                  SHAREDFS_DISABLE=disable, SHAREDFS_TEST_STAGGER_MS=str(STAGGER_MS))
    ranks = [subprocess.Popen([sys.executable, *RANK, str(sync), *repos], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=node_env(node, {**os.environ, **env},
                                                                              SHAREDFS_TEST_INDEX=i))
             for i, node in enumerate(NODES)]
    try:
        for trial in range(len(repos)):
            ranks_helper.go(sync, ranks, trial)
        return ranks_helper.results(ranks, len(repos))
    finally:
        ranks_helper.end(ranks)


@pytest.mark.long
def test_twelve_ranks_on_three_nfs_nodes_import_a_module_being_written_stock_and_never_with_sharedfs(
        hostile_mount, tmp_path: Path) -> None:
    m = hostile_mount("nfs-cto+lagging", lag_ms=LAG_MS, flush_ms=FLUSH_MS)
    hub = tmp_path / "hub"
    failures: dict[str, Counter[str]] = {}
    for label, disable in (("before", "transformers"), ("sharedfs", "")):
        failures[label] = Counter()
        # Stock: batches of TRIALS until the race shows (staggered, the first batch did in every run measured,
        # on an idle and on a loaded machine), at most BATCHES; with sharedfs: one batch, as many loads again.
        for batch in range(BATCHES if label == "before" else 1):
            repos = [f"{label}/b{batch}m{i}" for i in range(TRIALS)]
            for repo in repos:
                remotecode.make_repo(hub, repo)
            sync = tmp_path / f"sync-{label}-{batch}"
            sync.mkdir()
            results = load_on_nodes(m.path, m.backing, hub, sync, repos, disable)
            assert len(results) == len(NODES) * TRIALS
            failures[label].update(f"{r['error']}: {r['message'][:120]}" for r in results if not r["ok"])
            if failures[label]:
                break
    # Before: a module imported while another node was still writing it (read empty or short).
    before = failures["before"]
    assert sum(before.values()) >= 1, "the race did not show: stock never imported a module being written"
    assert all(text.startswith(("AttributeError", "SyntaxError", "NameError", "ImportError"))
               for text in before), before
    assert failures["sharedfs"] == Counter(), failures["sharedfs"]

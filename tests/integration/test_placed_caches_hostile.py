"""Placed caches and a node-local tree another user made first (issue 48, item 1): code execution as the victim.

With ``SHAREDFS_CACHE=node-local``, sharedfs exports ``TRITON_CACHE_DIR``, ``DG_JIT_CACHE_DIR``... naming
``<root>/sharedfs-<uid>/<job>/<name>``, a predictable path in a directory every user of the node can write
(``/tmp``).  bob (a real throwaway user, umask 022) makes alice's ``sharedfs-<uid>/nojob/`` first, his, mode
0777, and files a Triton kernel-cache entry at the key Triton computes for a small C module; or he puts a
symlink at ``sharedfs-<uid>`` to a directory of his.  Each test first shows the attack on the unchecked rule:
alice's Triton, with the variable naming that path as the rule named it, loads bob's ``.so`` (its code runs
as alice) or compiles into bob's directory.  Then alice's process with sharedfs: the directory is refused
with one warning naming bob's uid and the fix, every placed variable stays as alice had it (unset stays
unset: Triton compiles into her own default), and ``sharedfs env`` prints nothing and exits 2 with one line.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
from helpers import clean_env, require, unixusers

import sharedfs
from sharedfs.model.caches import PLACED_CACHES

require("triton", "needs triton (installed with torch; scripts/requirements-test.txt)")

pytestmark = [pytest.mark.xdist_group("users"), pytest.mark.slow]

CHECKOUT = str(Path(sharedfs.__file__).resolve().parents[1])
SITE = sysconfig.get_paths()["purelib"]
VARIABLES = [row.variable for row in PLACED_CACHES]
NAME = "sfs_tiny"

#: alice's small C module, built and loaded through Triton's cache as Triton's driver does for ``cuda_utils``.
ALICE_SRC = f"""
#include <Python.h>
static struct PyModuleDef def = {{PyModuleDef_HEAD_INIT, "{NAME}", NULL, -1, NULL}};
PyMODINIT_FUNC PyInit_{NAME}(void) {{ return PyModule_Create(&def); }}
"""

#: bob's module of the same name: it records the uid that runs its code.
BOB_SRC = f"""
#include <Python.h>
#include <unistd.h>
static struct PyModuleDef def = {{PyModuleDef_HEAD_INIT, "{NAME}", NULL, -1, NULL}};
PyMODINIT_FUNC PyInit_{NAME}(void) {{
    PyObject *m = PyModule_Create(&def);
    if (m) PyModule_AddIntConstant(m, "ran_as", (long)getuid());
    return m;
}}
"""

#: bob: make alice's node-local levels (his, 0777), build his module and file it at the key of hers.
PLANT = """
import os, sys, sysconfig, tempfile
from triton.runtime import build
alice_src, bob_src, name, top, *levels = sys.argv[1:]
for level in levels:
    top = os.path.join(top, level)
    os.mkdir(top)
    os.chmod(top, 0o777)
with tempfile.TemporaryDirectory() as tmp:
    src = os.path.join(tmp, name + ".c")
    with open(src, "w") as fh:
        fh.write(bob_src)
    with open(build._build(name, src, tmp, [], [], [], []), "rb") as fh:
        data = fh.read()
os.environ["TRITON_CACHE_DIR"] = os.path.join(top, "triton")
config = dict(language=["c"], library_dirs=None, include_dirs=None, libraries=None, ccflags=None)
print(build._get_cache_manager(alice_src.encode(), config).put(data, name + sysconfig.get_config_var("EXT_SUFFIX"),
                                                                 binary=True))
"""

#: alice's job: import Triton (sharedfs activates and exports), then build and load her module.
JOB = """
import json, os, sys
src, name, names = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
import triton
from triton.runtime.build import compile_module_from_src
out = {"env": {n: os.environ.get(n) for n in names}}
try:
    module = compile_module_from_src(src, name)
    out.update(ran_as=getattr(module, "ran_as", None), file=module.__file__)
except Exception as exc:
    out["error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


class Node(NamedTuple):
    root: Path  # the node-local root, sticky and everyone's, as /tmp is
    alice: unixusers.User
    bob: unixusers.User
    home: Path  # alice's home, where her libraries' defaults are


@pytest.fixture
def node() -> Iterator[Node]:
    base = Path(tempfile.mkdtemp(prefix="sharedfs-placed-hostile-",
                                 dir="/var/tmp" if os.path.isdir("/var/tmp") else None))
    base.chmod(0o755)
    root = base / "tmp"
    root.mkdir()
    root.chmod(0o1777)
    try:
        with unixusers.throwaway_users(2) as (alice, bob), unixusers.may_run_this_python(alice, CHECKOUT, SITE), \
                unixusers.may_run_this_python(bob, CHECKOUT, SITE):
            homes = {}
            for user in (alice, bob):
                homes[user.name] = base / f"home-{user.name}"
                homes[user.name].mkdir(mode=0o700)
                os.chown(homes[user.name], user.uid, user.gid)
            yield Node(root, alice, bob, homes[alice.name])
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _env(node: Node, user: unixusers.User, **extra: str) -> dict[str, str]:
    env = clean_env({"HOME": str(node.root.parent / f"home-{user.name}"), "SHAREDFS_CACHE": "node-local",
                     "SHAREDFS_CACHE_ROOT": str(node.root), **extra})
    for name in (*VARIABLES, "TRITON_HOME", "XDG_CACHE_HOME", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID",
                 "TORCH_EXTENSIONS_DIR", "TORCHINDUCTOR_CACHE_DIR"):
        if name not in extra:
            env.pop(name, None)
    return env


def _as(user: unixusers.User, argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return user.run(argv, env=env, cwd="/", umask=0o022, timeout=300)


def _plant(node: Node) -> Path:
    """bob's tree at alice's node-local path and his kernel-cache entry in it; returns the planted file."""
    done = _as(node.bob, [sys.executable, "-c", PLANT, ALICE_SRC, BOB_SRC, NAME, str(node.root),
                          f"sharedfs-{node.alice.uid}", "nojob"], _env(node, node.bob, SHAREDFS_DISABLE="1"))
    assert done.returncode == 0, done.stderr[-3000:]
    planted = Path(done.stdout.strip().splitlines()[-1])
    assert planted.stat().st_uid == node.bob.uid
    return planted


def _job(node: Node, **extra: str) -> tuple[dict, str]:
    done = _as(node.alice, [sys.executable, "-c", JOB, ALICE_SRC, NAME, json.dumps(VARIABLES)],
               _env(node, node.alice, **extra))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def _refusals(log: str) -> list[str]:
    return [line for line in log.splitlines() if "left unset (each library uses its own default)" in line]


def _sharedfs_env(node: Node) -> subprocess.CompletedProcess[str]:
    return _as(node.alice, [sys.executable, "-m", "sharedfs", "env"], _env(node, node.alice))


def test_bobs_premade_tree_gets_no_export_and_his_kernel_never_runs_as_alice(node: Node) -> None:
    planted = _plant(node)
    bobs = node.root / f"sharedfs-{node.alice.uid}"
    unchecked = bobs / "nojob" / "triton"  # what the rule names for alice's Triton, and sharedfs exported unchecked
    assert planted.parents[1] == unchecked

    # The unchecked export: alice's own Triton builds her module, and loads bob's code instead, as alice.
    before, _ = _job(node, SHAREDFS_DISABLE="1", TRITON_CACHE_DIR=str(unchecked))
    assert before.get("ran_as") == node.alice.uid and before["file"] == str(planted), before

    # sharedfs: nothing exported into bob's tree, alice's own setting kept, one line naming bob's uid and the fix.
    mine = str(node.home / "my-deep-gemm")
    after, log = _job(node, DG_JIT_CACHE_DIR=mine)
    assert after["env"] == {**dict.fromkeys(VARIABLES), "DG_JIT_CACHE_DIR": mine}, after
    assert "error" not in after and after["ran_as"] is None, after  # her own module
    assert after["file"].startswith(f"{node.home}/.triton/cache/"), after  # Triton's own default: unset stayed unset
    said = _refusals(log)
    assert len(said) == 1, log
    assert f"{bobs} is owned by uid {node.bob.uid}" in said[0] and "SHAREDFS_CACHE_ROOT" in said[0], said
    assert "DG_JIT_CACHE_DIR" not in said[0] and "TRITON_CACHE_DIR" in said[0], said
    assert unixusers.owned_by(node.alice.uid, str(bobs)) == []  # nothing of alice's in bob's tree

    # `sharedfs env` refuses: nothing on stdout for `eval`, status 2, one line.
    env = _sharedfs_env(node)
    assert env.returncode == 2 and env.stdout == "", env
    lines = env.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sharedfs env: "), env.stderr
    assert f"owned by uid {node.bob.uid}" in lines[0] and "not exported" in lines[0], lines


def test_a_symlink_bob_planted_on_the_way_is_refused_not_followed(node: Node) -> None:
    his = node.root / "bobs-cache"
    made = _as(node.bob, [sys.executable, "-I", "-S", "-c",
                          "import os, sys; os.mkdir(sys.argv[1], 0o777); os.chmod(sys.argv[1], 0o777); "
                          "os.symlink(sys.argv[1], sys.argv[2])",
                          str(his), str(node.root / f"sharedfs-{node.alice.uid}")], clean_env())
    assert made.returncode == 0, made.stderr
    link = node.root / f"sharedfs-{node.alice.uid}"
    unchecked = link / "nojob" / "triton"

    # The unchecked export: alice's kernels land in bob's directory (he may replace them at will).
    before, _ = _job(node, SHAREDFS_DISABLE="1", TRITON_CACHE_DIR=str(unchecked))
    assert "error" not in before and before["file"].startswith(f"{unchecked}/"), before
    assert unixusers.owned_by(node.alice.uid, str(his)) != []
    shutil.rmtree(his / "nojob")

    after, log = _job(node)
    assert after["env"] == dict.fromkeys(VARIABLES), after
    assert "error" not in after and after["file"].startswith(f"{node.home}/.triton/cache/"), after
    said = _refusals(log)
    assert len(said) == 1 and f"{link} is a symlink (to {his})" in said[0], log
    assert unixusers.owned_by(node.alice.uid, str(his)) == []
    assert link.is_symlink()  # refused, not removed: it is bob's

    env = _sharedfs_env(node)
    assert env.returncode == 2 and env.stdout == "" and "is a symlink" in env.stderr, env
    assert len(env.stderr.strip().splitlines()) == 1, env.stderr


def test_alices_own_tree_is_made_private_and_exported(node: Node) -> None:
    """The same job without bob: every level made 0700 by alice before its export; Triton compiles there."""
    after, log = _job(node)
    mine = node.root / f"sharedfs-{node.alice.uid}" / "nojob"
    assert after["env"] == {row.variable: str(mine / row.name) for row in PLACED_CACHES}, after
    assert after["file"].startswith(f"{mine}/triton/"), after
    assert not _refusals(log), log
    for level in (mine.parent, mine, *(mine / row.name for row in PLACED_CACHES)):
        st = level.lstat()
        assert (st.st_uid, st.st_mode & 0o777) == (node.alice.uid, 0o700), level
    env = _sharedfs_env(node)
    assert env.returncode == 0 and f"export TRITON_CACHE_DIR={mine}/triton" in env.stdout, env

"""The demo's lock fault library, cached where another user of the node got there first.

``sharedfs demo`` (and the tests) make lock calls fail by preloading a small library, built once and
cached; where the user's ``~/.cache`` cannot be written, the cache was ``$TMPDIR/sharedfs-testing-<uid>``,
a name any user of the node can predict.  bob (a real throwaway user) makes that directory first, or a
symlink there to his own, and puts his library at the name the cache would use.  With the code before, alice's
next preloaded process runs bob's code as alice; now the cache is refused in one line (the scenario is
skipped with it), and alice's own cache, made by her, is still used.
"""

from __future__ import annotations

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
from harness.skips import skip_or_fail
from helpers import clean_env, unixusers
from helpers.shardcache_support import sharedfs_at

import sharedfs

pytestmark = [pytest.mark.xdist_group("users")]

CHECKOUT = str(Path(sharedfs.__file__).resolve().parents[1])
SITE = sysconfig.get_paths()["purelib"]
#: The last commit whose fallback cache took any directory of that name (sharedfs.testing.preload then).
BEFORE = "76fe764"

#: bob: the name the cache would give the library, from the victim's own module (argv: module, top, how).
PLANT = """
import hashlib, os, subprocess, sys
mod = __import__(sys.argv[1], fromlist=["PRELOAD_SOURCE"])
top, how, evil = sys.argv[2], sys.argv[3], sys.argv[4]
digest = hashlib.sha256(mod.PRELOAD_SOURCE.read_bytes() + " ".join(mod._CFLAGS).encode()).hexdigest()[:16]
cache = os.path.join(top, sys.argv[5] + str(int(sys.argv[6])))
where = cache
if how == "symlink":
    where = os.path.join(top, "bobs-" + sys.argv[5])
    os.mkdir(where, 0o755)
    os.symlink(where, cache)
else:
    os.mkdir(cache, 0o755)
subprocess.run(["gcc", "-shared", "-fPIC", "-o", os.path.join(where, f"libsharedfs_fault-{digest}.so"), evil],
               check=True)
"""

#: alice: a child process with the fault library preloaded, as the demo's scenarios start theirs.
VICTIM = """
import subprocess, sys
mod = __import__(sys.argv[1], fromlist=["preload_env"])
try:
    env = mod.preload_env([sys.argv[2]], "ENOSYS")
except mod.PreloadUnavailable as exc:
    print(f"refused: {exc}")
    sys.exit(3)
print(env["LD_PRELOAD"])
sys.exit(subprocess.run(["/bin/true"], env=env).returncode)
"""

EVIL = r"""
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void ran(void) {
    FILE *f = fopen(MARK, "a");
    if (f) { fprintf(f, "%d\n", (int)getuid()); fclose(f); }
}
"""


class Node(NamedTuple):
    base: Path
    tmp: Path  # the node's /tmp: sticky, everyone's
    mark: Path  # bob's code writes the uid that ran it here
    evil: Path
    alice: unixusers.User
    bob: unixusers.User


@pytest.fixture
def node() -> Iterator[Node]:
    if not shutil.which("gcc"):
        skip_or_fail("gcc not found: the fault library is built with it (apt-get install gcc)")
    base = Path(tempfile.mkdtemp(prefix="sharedfs-preload-hostile-"))
    base.chmod(0o755)
    tmp = base / "tmp"
    tmp.mkdir()
    tmp.chmod(0o1777)
    out = base / "out"
    out.mkdir()
    out.chmod(0o1777)
    mark = out / "ran-as"
    evil = base / "evil.c"
    evil.write_text(EVIL.replace("MARK", f'"{mark}"'))
    evil.chmod(0o644)
    try:
        with unixusers.throwaway_users(2) as (alice, bob), \
                unixusers.may_run_this_python(alice, CHECKOUT, SITE, str(base)), \
                unixusers.may_run_this_python(bob, CHECKOUT, SITE, str(base)):
            yield Node(base, tmp, mark, evil, alice, bob)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _env(node: Node, pythonpath: str) -> dict[str, str]:
    # A home nobody can write, as for an account without one: the cache falls back to $TMPDIR.
    env = clean_env({"HOME": "/nonexistent", "TMPDIR": str(node.tmp), "PYTHONPATH": pythonpath})
    env.pop("XDG_CACHE_HOME", None)
    return env


def _attack(node: Node, how: str, module: str, prefix: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    planted = node.bob.run([sys.executable, "-c", PLANT, module, str(node.tmp), how, str(node.evil), prefix,
                            str(node.alice.uid)], env=env, cwd="/", umask=0o022, timeout=120)
    assert planted.returncode == 0, planted.stderr
    return node.alice.run([sys.executable, "-c", VICTIM, module, str(node.base / "fs")], env=env, cwd="/",
                          umask=0o022, timeout=120)


def _ran_as(node: Node) -> list[int]:
    return [int(line) for line in node.mark.read_text().split()] if node.mark.exists() else []


@pytest.mark.parametrize("how", ["directory", "symlink"])
def test_bobs_fault_library_never_runs_as_alice(node: Node, how: str) -> None:
    before = sharedfs_at(BEFORE, node.base / "before")
    victim = _attack(node, how, "sharedfs.testing.preload", "sharedfs-testing-", _env(node, before["PYTHONPATH"]))
    assert victim.returncode == 0, victim.stdout + victim.stderr
    assert _ran_as(node) == [node.alice.uid], "the code before should have run bob's library as alice"

    node.mark.unlink()
    victim = _attack(node, how, "sharedfs.demo.preload", "sharedfs-demo-", _env(node, CHECKOUT))
    assert _ran_as(node) == [], "bob's library ran as alice"
    assert victim.returncode == 3, victim.stdout + victim.stderr
    reason = "not a directory" if how == "symlink" else f"belongs to uid {node.bob.uid}"
    assert reason in victim.stdout and victim.stdout.count("\n") == 1, victim.stdout


def test_alices_own_fallback_cache_is_used_again(node: Node) -> None:
    env = _env(node, CHECKOUT)
    runs = [node.alice.run([sys.executable, "-c", VICTIM, "sharedfs.demo.preload", str(node.base / "fs")],
                           env=env, cwd="/", umask=0o022, timeout=120) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stdout + run.stderr
    cache = node.tmp / f"sharedfs-demo-{node.alice.uid}"
    st = os.lstat(cache)
    assert (st.st_uid, st.st_mode & 0o777) == (node.alice.uid, 0o700)
    assert runs[0].stdout == runs[1].stdout and runs[0].stdout.startswith(str(cache)), [r.stdout for r in runs]

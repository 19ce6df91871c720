"""A placed cache variable inherited by a process that runs as another user.

With ``SHAREDFS_CACHE=node-local``, the first import of a framework sharedfs patches (here Triton's
cache module, which ``torch.compile`` imports) exports ``TRITON_CACHE_DIR=<root>/sharedfs-<uid>/<job>/triton``
and its siblings, so that compiler workers use them.  A process of root that starts a program as
another user (``su``, ``setpriv``, ``subprocess.run(user=...)``) hands that user the variables, and
the directory they name is root's, mode 0700.  A real throwaway user's process, sharedfs off in it
(``SHAREDFS_DISABLE=1``: what sharedfs did with the inherited value before, take it for the user's
own setting), fails storing a kernel: ``PermissionError: [Errno 13] Permission denied:
'<root>/sharedfs-0/nojob...'``;
with sharedfs on, it places its own directory and Triton writes there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest
from helpers import clean_env, require, unixusers

import sharedfs

require("triton", "needs triton (installed with torch; scripts/requirements-test.txt)")

pytestmark = pytest.mark.xdist_group("users")

CHECKOUT = str(Path(sharedfs.__file__).resolve().parents[1])
SITE = sysconfig.get_paths()["purelib"]

#: The other user's program: Triton stores a compiled kernel in its cache.
CHILD = """
import json, os
from triton.runtime.cache import get_cache_manager
out = {"TRITON_CACHE_DIR": os.environ.get("TRITON_CACHE_DIR")}
try:
    out["stored"] = get_cache_manager("0" * 64).put(b"kernel", "k.bin")
except Exception as exc:
    out["error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""

#: Root's program: imports Triton's cache module (sharedfs exports the placements), stores a kernel, then starts
#: CHILD as the user.
PARENT = """
import json, os, subprocess, sys
from triton.runtime.cache import get_cache_manager
get_cache_manager("1" * 64).put(b"kernel", "k.bin")
uid, gid, child = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
out = {"parent": os.environ.get("TRITON_CACHE_DIR")}
for label, extra in (("sharedfs off", {"SHAREDFS_DISABLE": "1"}), ("sharedfs on", {})):
    proc = subprocess.run([sys.executable, "-c", child], user=uid, group=gid, extra_groups=[], cwd="/",
                          env={**os.environ, **extra}, capture_output=True, text=True, timeout=300)
    out[label] = json.loads(proc.stdout) if proc.returncode == 0 and proc.stdout else proc.stderr[-2000:]
print(json.dumps(out))
"""


def test_a_child_of_another_user_gets_permission_denied_off_and_its_own_directory_with_sharedfs() -> None:
    root = Path(tempfile.mkdtemp(prefix="sharedfs-inherited-", dir="/var/tmp" if os.path.isdir("/var/tmp") else None))
    root.chmod(0o1777)  # a node-local root as /tmp is: every user's, sticky
    try:
        with unixusers.throwaway_users(1) as (user,), unixusers.may_run_this_python(user, CHECKOUT, SITE):
            env = clean_env({"SHAREDFS_CACHE": "node-local", "SHAREDFS_CACHE_ROOT": str(root)})
            for variable in ("TRITON_CACHE_DIR", "TRITON_HOME", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"):
                env.pop(variable, None)
            proc = subprocess.run([sys.executable, "-c", PARENT, str(user.uid), str(user.gid), CHILD], env=env,
                                  cwd="/", capture_output=True, text=True, timeout=600)
            assert proc.returncode == 0, proc.stderr[-3000:]
            out = json.loads(proc.stdout.strip().splitlines()[-1])
            mine = root / f"sharedfs-{os.getuid()}" / "nojob" / "triton"
            assert out["parent"] == str(mine), out

            off = out["sharedfs off"]
            assert off["TRITON_CACHE_DIR"] == str(mine), off
            # Denied inside root's sharedfs-0/ (which level Triton's makedirs names depends on what root's process
            # made: sharedfs makes the placed directory itself before exporting it)
            denied = f"PermissionError: [Errno 13] Permission denied: '{mine.parents[1]}/"
            assert off.get("error", "").startswith(denied), off

            on = out["sharedfs on"]
            theirs = root / f"sharedfs-{user.uid}" / "nojob" / "triton"
            assert on.get("TRITON_CACHE_DIR") == str(theirs) and "error" not in on, on
            stored = Path(on["stored"])
            assert stored.parent.parent == theirs and stored.read_bytes() == b"kernel"
            assert stored.stat().st_uid == user.uid
            assert unixusers.owned_by(user.uid, str(mine.parents[1])) == []  # nothing of theirs in root's
    finally:
        shutil.rmtree(root, ignore_errors=True)

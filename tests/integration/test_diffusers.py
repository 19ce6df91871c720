"""The diffusers shim: its remote-code modules in a lab's shared ``HF_HOME``, with real users.

Real diffusers (scripts/requirements-test.txt).  Each member loads a custom pipeline class from a
local directory with diffusers' own ``get_class_from_dynamic_module(..., trust_remote_code=True)``
(what ``DiffusionPipeline.from_pretrained(..., custom_pipeline=<dir>)`` calls), which copies the
module into ``HF_MODULES_CACHE/diffusers_modules/local/`` on every load.  Stock, under umask 022,
the second member fails: the first member's ``local/`` is 2755 (diffusers#1517, diffusers#9798).
With sharedfs every load works, a module already there with the same content is not rewritten, and
what the members made in the module cache is the group's: directories it may add to (sticky), files
it may read but not write.
"""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import sys

import pytest
from harness.skips import skip_or_fail
from helpers.shardcache_support import group_of_users, scratch

# Looked up, not imported: importing diffusers imports torch here, whose cache placement the members'
# processes would then inherit through this process's environment.
if importlib.util.find_spec("diffusers") is None:
    skip_or_fail("needs diffusers==0.42.1 (scripts/requirements-test.txt)", module_level=True)

pytestmark = pytest.mark.slow

LOAD = """
import json, sys
from diffusers.utils import get_class_from_dynamic_module
out = {}
for spec in sys.argv[1:]:
    directory, module, cls = spec.split(":")
    try:
        out[spec] = "ok " + get_class_from_dynamic_module(directory, module, class_name=cls,
                                                          trust_remote_code=True).KIND
    except Exception as exc:
        out[spec] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


def test_second_member_of_a_team_hf_home_fails_stock_and_loads_with_sharedfs() -> None:
    with scratch("sharedfs-diffusers-") as root, group_of_users(2, root) as (alice, bob):
        specs = {}
        for who in ("alice", "bob"):
            source = root / f"{who}-pipeline"
            source.mkdir(mode=0o755)
            (source / f"pipeline_{who}.py").write_text(f'class {who.title()}Pipeline:\n    KIND = "{who}"\n')
            (source / f"pipeline_{who}.py").chmod(0o644)
            specs[who] = f"{source}:pipeline_{who}.py:{who.title()}Pipeline"

        def run(label: str, disable: str | None) -> tuple[list[dict[str, str]], str]:
            home = root / label
            home.mkdir()
            os.chown(home, 0, alice.group)
            home.chmod(0o2775)
            env = {"HF_HOME": str(home), "HF_HUB_OFFLINE": "1", **({"SHAREDFS_DISABLE": disable} if disable else {})}
            outcomes = []
            for user, loads in ((alice, [specs["alice"]]), (bob, [specs["bob"], specs["alice"]])):
                proc = user.run([sys.executable, "-c", LOAD, *loads], env=env, umask=0o022, timeout=300)
                assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr[-3000:]
                outcomes.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            return outcomes, str(home / "modules")

        stock, _ = run("stock", "1")
        assert stock[0] == {specs["alice"]: "ok alice"}
        assert stock[1][specs["bob"]].startswith("PermissionError: [Errno 13] Permission denied"), stock[1]

        shared, modules = run("sharedfs", None)
        assert shared == [{specs["alice"]: "ok alice"}, {specs["bob"]: "ok bob", specs["alice"]: "ok alice"}]
        keeping_out = []
        for dirpath, dirnames, filenames in os.walk(modules):
            for name in (*dirnames, *filenames):
                st = os.lstat(os.path.join(dirpath, name))
                is_dir = stat.S_ISDIR(st.st_mode)
                # members add to every directory, but only an entry's owner changes it: code is read-only to others
                need = stat.S_IRWXG | stat.S_ISGID | stat.S_ISVTX if is_dir else stat.S_IRGRP
                never = 0 if is_dir else stat.S_IWGRP | stat.S_IWOTH
                if st.st_gid != alice.group or st.st_mode & need != need or st.st_mode & never:
                    keeping_out.append(f"{os.path.join(dirpath, name)} {oct(stat.S_IMODE(st.st_mode))}")
        assert not keeping_out, keeping_out
        local = os.path.join(modules, "diffusers_modules", "local")
        # bob's second load found alice's module in place with the same content: not rewritten, still hers.
        assert os.stat(os.path.join(local, "pipeline_alice.py")).st_uid == alice.uid
        assert os.stat(os.path.join(local, "pipeline_bob.py")).st_uid == bob.uid


PATCHED = """
import json, shutil, sharedfs, diffusers.utils.dynamic_modules_utils as d
seen = lambda: [d.shutil is shutil, "modulecache" in d.get_cached_module_file.__code__.co_filename]
out = [seen()]
sharedfs.disable()
out.append(seen())
print(json.dumps(out))
"""


def test_applied_on_the_dynamic_module_import_reversible_and_blocked_by_name(tmp_path) -> None:
    import subprocess

    def run(**env: str) -> list[list[bool]]:
        proc = subprocess.run([sys.executable, "-c", PATCHED], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "HF_HOME": str(tmp_path), "SHAREDFS_STRICT": "1", **env})
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout)

    assert run() == [[False, True], [True, False]]
    assert run(SHAREDFS_DISABLE="diffusers")[0] == [True, False]

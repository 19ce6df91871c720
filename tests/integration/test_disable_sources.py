"""``disable`` blocks a plugin alike from each of its three sources: the variable, the TOML file, ``configure()``.

docs/settings.md promised the three sources behave alike; before this change only ``SHAREDFS_DISABLE``
blocked a plugin (at registration). ``disable = ["slurm"]`` in the TOML file, or
``sharedfs.configure(disable="slurm")``, showed in ``status`` as a setting while the slurm plugin stayed
registered and still named the node (``SLURMD_NODENAME``) and the rank (``SLURM_PROCID``).  Each source
runs against the code before the change (``BEFORE``, unpacked with git archive, first on PYTHONPATH) and
this checkout (``sharedfs_at``), in a process of its own with a Slurm step's environment.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import clean_env
from helpers.shardcache_support import sharedfs_at

#: The last commit before TOML and configure() blocked plugins.
BEFORE = "961ec2c"

SLURM = {"SLURM_JOB_ID": "4242", "SLURM_PROCID": "3", "SLURM_NTASKS": "8", "SLURMD_NODENAME": "gpu-node-17"}

#: What the slurm plugin decides in this process: the node id, and whose rank identity this is.
PROBE = r"""
import json, sys
import sharedfs
from sharedfs.machinery import runtime
if sys.argv[1] == "configure":
    sharedfs.configure(disable="slurm")
ident = runtime.identity()
print(json.dumps({"node_id": runtime.policy().node_id, "identity": ident.source, "rank": ident.rank,
                  "blocked": sorted(runtime.registry().blocked)}))
"""


@pytest.fixture(scope="module")
def old_sharedfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(sharedfs_at(BEFORE, tmp_path_factory.mktemp("before") / "sharedfs")["PYTHONPATH"])


def probe(source: str, tmp_path: Path, code: Path | None) -> dict:
    env = dict(SLURM)
    if source == "variable":
        env["SHAREDFS_DISABLE"] = "slurm"
    elif source == "toml":
        config = tmp_path / "sharedfs.toml"
        config.write_text('disable = ["slurm"]\n')
        env["SHAREDFS_CONFIG"] = str(config)
    if code is not None:
        env["PYTHONPATH"] = str(code)
    # From "/": ``python -c`` would put the working directory (the checkout, under pytest) first on sys.path.
    proc = subprocess.run([sys.executable, "-c", PROBE, source], env=clean_env(env), cwd="/", capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_variable_blocked_the_slurm_plugin_before_and_still_does(tmp_path: Path, old_sharedfs: Path) -> None:
    for code in (old_sharedfs, None):
        got = probe("variable", tmp_path, code)
        assert got["blocked"] == ["slurm"] and got["identity"] != "slurm" and got["node_id"] != "gpu-node-17", got


@pytest.mark.parametrize("source", ["toml", "configure"])
def test_the_toml_file_and_configure_left_the_slurm_plugin_deciding_and_now_block_it(
        source: str, tmp_path: Path, old_sharedfs: Path) -> None:
    before = probe(source, tmp_path, old_sharedfs)
    print(f"disable=slurm from {source}, sharedfs {BEFORE}: {before}")
    assert before["blocked"] == [] and before["identity"] == "slurm" and before["rank"] == 3
    assert before["node_id"] == "gpu-node-17"  # the plugin it was told to leave out still named the node

    now = probe(source, tmp_path, None)
    print(f"disable=slurm from {source}, now: {now}")
    assert now["blocked"] == ["slurm"] and now["identity"] != "slurm" and now["node_id"] != "gpu-node-17", now

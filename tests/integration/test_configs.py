"""Every file in configs/ loads: policy TOMLs resolve, mmengine/XTuner configs parse and build SharedFSHook."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sharedfs.model.policy import resolve

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
POLICIES = sorted((CONFIGS / "policy").glob("*.toml"))

needs_mmengine = pytest.mark.skipif(
    importlib.util.find_spec("mmengine") is None and not os.environ.get("CI"),
    reason="mmengine missing: pip install -r scripts/requirements-test.txt (mmengine==0.10.7)",
)


def test_every_config_file_is_covered() -> None:
    found = {p.relative_to(CONFIGS).as_posix() for p in CONFIGS.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert found == {"mmengine_sharedfs.py", "xtuner/llama2_7b_qlora_alpaca_e3_sharedfs.py",
                     "slurm/xtuner_train.sbatch", "slurm/epilog.sh", "policy/gpfs.toml", "policy/lustre.toml",
                     "policy/nfs.toml"}


@pytest.mark.parametrize("path", POLICIES, ids=[p.stem for p in POLICIES])
def test_site_policy_file_resolves(path: Path) -> None:
    from sharedfs.plugins.settings import read_toml_layer

    layer = read_toml_layer(str(path))
    policy = resolve([layer])
    assert set(layer.values) >= {"lock", "cache", "wait_timeout"}
    for key in layer.values:  # every value came from the file and passed validation
        assert policy.source(key) == f"{path}: {key}"
    assert {"gpfs": "posix", "lustre": "lease", "nfs": "lease"}[path.stem] == policy.lock


def test_site_policy_through_sharedfs_config(fresh_runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    """The way jobs use them: SHAREDFS_CONFIG names the file; the environment still wins over it."""
    monkeypatch.setenv("SHAREDFS_CONFIG", str(CONFIGS / "policy" / "nfs.toml"))
    monkeypatch.setenv("SHAREDFS_WAIT_TIMEOUT", "30")
    policy = fresh_runtime.policy()
    assert (policy.lock, policy.cache, policy.wait_timeout) == ("lease", "node-local", 30.0)
    assert policy.source("wait_timeout") == "SHAREDFS_WAIT_TIMEOUT"


@needs_mmengine
def test_mmengine_config_string_form_builds_the_hook(fresh_runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    from mmengine.config import Config
    from mmengine.registry import HOOKS

    monkeypatch.setenv("SHAREDFS_CACHE", "shared")
    cfg = Config.fromfile(str(CONFIGS / "mmengine_sharedfs.py"))  # runs custom_imports
    (spec,) = [h for h in cfg.custom_hooks if h["type"] == "SharedFSHook"]
    hook = HOOKS.build(dict(spec))
    from sharedfs.shims.mmengine import SharedFSHook

    assert isinstance(hook, SharedFSHook)
    policy = fresh_runtime.policy()
    assert policy.cache == "node-local" and policy.source("cache") == "argument cache"  # over SHAREDFS_CACHE
    assert policy.wait_timeout == 600.0


@needs_mmengine
def test_xtuner_config_python_form_names_the_hook_class() -> None:
    """XTuner's pure-Python config parses (mmengine imports it lazily) and holds the class itself.

    Building every object needs XTuner itself: tests/integration/test_xtuner.py loads this config
    in the XTuner venv.
    """
    from mmengine.config import Config

    from sharedfs.shims.mmengine import SharedFSHook

    cfg = Config.fromfile(str(CONFIGS / "xtuner" / "llama2_7b_qlora_alpaca_e3_sharedfs.py"))
    spec = cfg.custom_hooks[0]
    assert spec["type"] is SharedFSHook
    assert {k: v for k, v in spec.items() if k != "type"} == {"cache": "node-local", "wait_timeout": 600}


@needs_mmengine
def test_bad_hook_argument_says_what_and_where(fresh_runtime) -> None:
    import sharedfs
    from sharedfs.shims.mmengine import SharedFSHook

    with pytest.raises(TypeError, match="unknown argument.*cahce.*accepts the policy settings lock, cache"):
        SharedFSHook(cahce="node-local")
    with pytest.raises(sharedfs.ConfigError, match="argument lock='flok' is not valid"):
        SharedFSHook(lock="flok")


def test_slurm_batch_script() -> None:
    script = CONFIGS / "slurm" / "xtuner_train.sbatch"
    bash = shutil.which("bash")
    assert bash, "bash is needed to check the batch script"
    proc = subprocess.run([bash, "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    text = script.read_text()
    assert text.startswith("#!/bin/bash\n") and "#SBATCH --nodes=" in text
    assert 'srun --kill-on-bad-exit=1 xtuner train "$CONFIG" --launcher slurm' in text
    assert "SHAREDFS_CONFIG" in text and "XTUNER_DATASET_TIMEOUT" in text
    assert 'eval "$(sharedfs env)"' in text
    # The default policy file it points at exists.
    assert "$HERE/../policy/lustre.toml" in text and (CONFIGS / "policy" / "lustre.toml").exists()


def test_slurm_epilog_cleans_exactly_the_job() -> None:
    script = CONFIGS / "slurm" / "epilog.sh"
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert 'sharedfs cleanup --job "$SLURM_JOB_ID" --uid "$SLURM_JOB_UID"' in script.read_text()
    assert os.access(script, os.X_OK)

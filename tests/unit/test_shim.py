"""Patcher and Shim: every patch is reversible, idempotent, and never left half-applied."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

from sharedfs.machinery.shimbase import Patcher, Shim
from sharedfs.model.policy import resolve


class Base:
    inherited = "base"


def test_patcher_restores_own_inherited_and_missing_attributes_and_items() -> None:
    class Child(Base):
        own = "own"

    mapping = {"kept": 1}
    patcher = Patcher()
    patcher.setattr(Child, "own", "x")
    patcher.setattr(Child, "inherited", "x")
    patcher.setattr(Child, "new", "x")
    patcher.setitem(mapping, "kept", 2)
    patcher.setitem(mapping, "added", 3)
    assert (Child.own, Child.inherited, Child.new, mapping) == ("x", "x", "x", {"kept": 2, "added": 3})
    assert patcher.changes() == ["Child.own", "Child.inherited", "Child.new", "dict['kept']", "dict['added']"]
    patcher.restore()
    assert Child.own == "own" and "inherited" not in vars(Child) and Child.inherited == "base"
    assert not hasattr(Child, "new") and mapping == {"kept": 1}


class FakeFrameworkShim(Shim):
    name = target = distribution = "fake_framework_for_shim_test"
    supported = ">=1"
    calls = 0

    def apply(self, module, policy, context):
        type(self).calls += 1
        self.patcher.setattr(module, "value", policy.lock)
        if policy.lock == "lease":
            raise RuntimeError("half-way")
        self.patcher.setattr(module, "other", 1)


@pytest.fixture
def module():
    mod = types.ModuleType(FakeFrameworkShim.target)
    mod.value = "original"
    sys.modules[mod.__name__] = mod
    yield mod
    del sys.modules[mod.__name__]


def test_patch_is_idempotent_reapplies_on_new_policy_and_unpatch_restores(module) -> None:
    shim = FakeFrameworkShim()
    soft = resolve([]).__class__(**{**resolve([]).__dict__, "lock": "soft"})
    shim.patch(soft)
    shim.patch(soft)
    assert FakeFrameworkShim.calls == 1 and module.value == "soft" and shim.applied
    posix = soft.__class__(**{**soft.__dict__, "lock": "posix"})
    shim.patch(posix)
    assert module.value == "posix" and FakeFrameworkShim.calls == 2
    shim.unpatch()
    assert module.value == "original" and not hasattr(module, "other") and not shim.applied


def test_a_failing_apply_leaves_nothing_behind(module) -> None:
    shim = FakeFrameworkShim()
    lease = resolve([]).__class__(**{**resolve([]).__dict__, "lock": "lease"})
    with pytest.raises(RuntimeError):
        shim.patch(lease)
    assert module.value == "original" and not shim.applied


def test_the_bootstraps_table_is_every_builtin_shim_and_the_only_place_a_target_is_written() -> None:
    # The bootstrap spells its table (and the DISABLE variable) itself so that start-up imports
    # nothing from the package: one row per shim, no shim without a row, no target written twice.
    from importlib import import_module

    import _sharedfs_bootstrap as _bootstrap
    from sharedfs.machinery.registry import BUILTIN_SHIMS
    from sharedfs.model import envvars

    declared = {}
    for module in BUILTIN_SHIMS:
        shim_module = import_module(f"sharedfs.shims.{module}")
        source = Path(shim_module.__file__ or "").read_text()
        assert not re.search(r"^\s+target\s*=", source, re.M), f"shims/{module}.py: a target is its row of SHIMS"
        for shim in shim_module.sharedfs_register_shims():
            declared[shim.name] = shim.target
    assert declared == {name: row[0] for name, row in _bootstrap.SHIMS.items()}
    ways = {_bootstrap.AT_ONCE, _bootstrap.STAND_IN, _bootstrap.PENDING, _bootstrap.FOLLOWER}
    for name, (_target, how, *details) in _bootstrap.SHIMS.items():
        assert how in ways, name
        assert how != _bootstrap.STAND_IN or isinstance(details[0], dict), f"{name}: which attributes to stand in"
        assert how == _bootstrap.STAND_IN or set(details) <= {_bootstrap.COMPANION}, name
    assert (_bootstrap.DISABLE, _bootstrap.TRUE_VALUES) == (envvars.DISABLE, envvars.TRUE_VALUES)
    from sharedfs.machinery.registry import NAME
    from sharedfs.startup.onimport import PLUGIN_GROUP

    assert PLUGIN_GROUP == NAME, "a follower defers only while no third-party plugin is installed"


def test_plugins_and_shims_load_once_under_one_name() -> None:
    # In a checkout the folders are also importable as top-level packages; a second copy of a
    # plugin module would keep caches of its own (a second liveness cache, a second registry).
    import subprocess

    from helpers import clean_env

    code = ("import importlib, sys\n"
            "import sharedfs.plugins.slurm\n"
            "for name in ('plugins.slurm', 'shims.datasets'):\n"
            "    try:\n"
            "        importlib.import_module(name)\n"
            "    except ImportError as exc:\n"
            "        print('refused', name, exc)\n"
            "    else:\n"
            "        print('loaded twice', name)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(),
                         cwd=str(__import__("pathlib").Path(__file__).parents[2]))
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("refused") == 2 and "loaded twice" not in out.stdout, out.stdout
    assert "import sharedfs.plugins, not plugins" in out.stdout


def test_reading_the_shim_table_under_python_S_does_not_switch_the_autoload_on() -> None:
    # `python -S` runs no .pth: the autoload is off, and a kernel module that reads the bootstrap's
    # table (the registry does) must not install the finder as a side effect of that import.
    import subprocess
    from pathlib import Path

    import _sharedfs_bootstrap

    code = ("import sys; sys.path[:0] = sys.argv[1:]\n"
            "import sharedfs.machinery.registry, _sharedfs_bootstrap as b\n"
            "print(b.installed(), any(f is b for f in sys.meta_path))\n")
    import pluggy

    # The checkout and site-packages as plain path entries: no .pth in them runs.
    roots = list(dict.fromkeys(str(p) for p in (Path(_sharedfs_bootstrap.__file__).parent,
                                                Path(__import__("sharedfs").__file__).parents[1],
                                                Path(pluggy.__file__).parents[1])))
    proc = subprocess.run([sys.executable, "-S", "-c", code, *roots], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "False"]

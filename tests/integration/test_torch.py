"""User stories of the torch shims: real torch 2.x on CPU, a real C++ extension built by ninja and g++, real kills.

``torch.utils.cpp_extension.load()`` is how DeepSpeed (and so XTuner) JIT-compiles its ops.
The extension is ``sharedfs/testing/torch_ext/answer.cpp`` (Python.h only: it builds in
under a second); the compiler is a wrapper that counts compilations and can be held
mid-compile, so "killed half-way through the build" is exact
(:mod:`sharedfs.testing.scenario_torch`).  Each test reproduces the failure first where
one exists, then shows the fix.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import clean_env, require

from sharedfs.testing.nodes import node_env, run_on_nodes
from sharedfs.testing.pytest_plugin import skip_or_fail
from sharedfs.testing.scenario_torch import (
    EXTENSION,
    LOAD,
    SOURCE,
    Toolchain,
    ToolchainMissing,
    answer,
    finish,
    kill_mid_build,
    run_load,
    start_load,
    toolchain,
    torch_extension_stale_lock,
)

pytestmark = pytest.mark.slow
require("torch", "the torch shims are tested against real torch")

#: How long a load() must keep waiting to count as "waits forever" (a rerun takes about 3 s here).
HANG = 8.0
#: A fake squeue (first on PATH): every job it is asked about was cancelled.
FAKE_SQUEUE = """#!/bin/sh
echo "$*" >> "$FAKE_SLURM_CALLS"
job=$(echo " $* " | sed -n 's/.* -j \\([0-9]*\\) .*/\\1/p')
echo "$job|$job|CANCELLED|2026-01-01T00:00:00"
"""


@pytest.fixture
def chain(tmp_path: Path) -> Toolchain:
    try:
        return toolchain(tmp_path)
    except ToolchainMissing as exc:
        skip_or_fail(str(exc))


def loaded(done: subprocess.CompletedProcess[str] | None) -> bool:
    result = answer(done)
    return result is not None and result["answer"] == 42


def test_a_build_killed_half_way_hangs_every_later_load_without_sharedfs_and_is_rebuilt_with_it(
    tmp_path: Path,
) -> None:
    """pytorch#189245 on one node, as ``sharedfs demo`` shows it: the killed builder's <build_dir>/lock stays
    and torch's FileBaton.wait() spins forever; with sharedfs the rerun breaks it (its holder is gone) and builds."""
    try:
        result = torch_extension_stale_lock(tmp_path, clean_env(), hang_after=HANG)
    except ToolchainMissing as exc:
        skip_or_fail(str(exc))
    assert not result.ok_without and "waits for it forever" in result.without, result
    plain = tmp_path / "without" / "torch_extensions" / EXTENSION / "lock"
    assert plain.exists() and plain.stat().st_size == 0

    assert result.ok_with and "rebuilt" in result.with_sharedfs, result
    assert not (tmp_path / "with" / "torch_extensions" / EXTENSION / "lock").exists()  # released for plain torch too
    # Each killed build compiled once, and so did the rerun: the half-built extension was rebuilt, never loaded.
    assert len((tmp_path / "toolchain" / "compiles.log").read_text().split()) == 3


def test_a_build_killed_on_another_node_is_rebuilt_once_slurm_says_its_job_ended(
    tmp_path: Path, chain: Toolchain, hostile_mount
) -> None:
    """Lustre without flock, two nodes: node a's job is cancelled mid-build; node b's load() must not hang."""
    lustre = hostile_mount("lustre-noflock").path
    squeue = tmp_path / "slurm-bin" / "squeue"
    squeue.parent.mkdir()
    squeue.write_text(FAKE_SQUEUE)
    squeue.chmod(0o755)
    calls = tmp_path / "squeue-calls"
    path = f"{squeue.parent}{os.pathsep}{os.environ['PATH']}"

    for side, extra in (("plain", {"SHAREDFS_DISABLE": "1"}), ("fixed", {"SHAREDFS_LOG": "info"})):
        base = clean_env({**extra, "PATH": path, "FAKE_SLURM_CALLS": str(calls)})
        on_a = chain.env(node_env("a", base, SLURM_JOB_ID="4242"), lustre / side)
        on_b = chain.env(node_env("b", base), lustre / side)
        kill_mid_build(chain, on_a)
        rerun = run_load(on_b, HANG if side == "plain" else 60)
        if side == "plain":
            assert rerun is None, "torch without sharedfs should wait forever for node a's dead builder"
        else:
            assert rerun is not None and loaded(rerun), rerun
            assert "left unfinished by pid" in rerun.stderr and "on node a, Slurm job 4242" in rerun.stderr
    assert "-j 4242" in calls.read_text()  # node b could not see node a's pid: it asked the scheduler


def test_four_processes_on_two_nodes_loading_at_once_compile_once(
    tmp_path: Path, chain: Toolchain, hostile_mount
) -> None:
    """DeepSpeed ranks load() the same op at once; one compiles, the others wait and load the result."""
    root = hostile_mount("lustre-noflock").path / "extensions"
    env = chain.env(clean_env(), root)
    results = run_on_nodes([sys.executable, "-c", LOAD, EXTENSION, str(SOURCE)], {"a": 2, "b": 2}, env=env,
                           timeout=120)
    assert [r.returncode for r in results] == [0, 0, 0, 0], [r.stderr[-2000:] for r in results]
    assert [json.loads(r.stdout)["answer"] for r in results] == [42] * 4
    assert chain.compiles() == 1


def test_torch_without_sharedfs_in_the_same_directory_waits_for_sharedfs_and_is_waited_for(
    tmp_path: Path, chain: Toolchain
) -> None:
    """A second environment (or SHAREDFS_DISABLE) sharing TORCH_EXTENSIONS_DIR: neither builds beside the other."""
    for builder_extra, waiter_extra in (({"SHAREDFS_DISABLE": "1"}, {}), ({}, {"SHAREDFS_DISABLE": "1"})):
        root = tmp_path / ("plain-builds" if builder_extra else "sharedfs-builds")
        builder_env = chain.env(clean_env(builder_extra), root)
        waiter_env = chain.env(clean_env(waiter_extra), root)
        before = chain.compiles()
        chain.hold()
        try:
            builder = start_load(builder_env)
            while chain.compiles() == before:
                assert builder.poll() is None, builder.communicate()
                time.sleep(0.05)
            waiter = start_load(waiter_env)
            time.sleep(4)  # long enough to import torch and reach the baton
            assert waiter.poll() is None, "the second process must wait for the live build, not build beside it"
        finally:
            chain.let_go()
        assert loaded(finish(builder, 60)) and loaded(finish(waiter, 60))
        assert chain.compiles() == before + 1


PLACES = """
import json
from torch.utils import cpp_extension
from torch._inductor.runtime import cache_dir_utils
print(json.dumps({"extensions": cpp_extension._get_build_directory("x", False), "inductor": cache_dir_utils.cache_dir(),
                  "batons": cpp_extension.FileBaton.__module__}))
"""


def places(extra: dict[str, str], tmp_path: Path) -> dict[str, str]:
    env = clean_env({"HOME": str(tmp_path / "home"), "SHAREDFS_CACHE_ROOT": str(tmp_path / "local"), **extra})
    env.pop("TMPDIR", None)
    env.pop("XDG_CACHE_HOME", None)
    env.pop("SLURM_JOB_ID", None)
    (tmp_path / "local").mkdir(exist_ok=True, mode=0o700)
    done = subprocess.run([sys.executable, "-c", PLACES], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_cache_placement_moves_the_extension_and_inductor_caches_and_keeps_what_the_user_set(tmp_path: Path) -> None:
    local = tmp_path / "local" / f"sharedfs-{os.getuid()}" / "nojob"

    moved = places({"SHAREDFS_CACHE": "node-local"}, tmp_path)
    assert moved["extensions"].startswith(str(local / "torch.cpp_ext") + "/")  # torch adds py3X_cpu/x below it
    assert moved["inductor"] == str(local / "torch.inductor")
    assert moved["batons"] == "sharedfs.shims.torch"

    kept = places({"SHAREDFS_CACHE": "node-local", "TORCH_EXTENSIONS_DIR": str(tmp_path / "mine"),
                   "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}, tmp_path)
    assert kept["extensions"] == str(tmp_path / "mine" / "x") and kept["inductor"] == str(tmp_path / "inductor")

    # auto: the extensions keep torch's default in the home directory (every lock there is sharedfs's now);
    # Inductor's default is a fixed name in /tmp, which every user can create first: it moves.
    auto = places({}, tmp_path)
    assert auto["extensions"].startswith(str(tmp_path / "home" / ".cache" / "torch_extensions") + "/")
    assert auto["inductor"] == str(local / "torch.inductor")

    off = places({"SHAREDFS_DISABLE": "torch", "SHAREDFS_CACHE": "node-local"}, tmp_path)
    assert off["batons"] == "torch.utils.file_baton" and off["extensions"].startswith(str(tmp_path / "home"))


RECONFIGURE = """
import json, os, sharedfs
from torch.utils import cpp_extension
from torch._inductor.runtime import cache_dir_utils, runtime_utils
before = cache_dir_utils.cache_dir()
sharedfs.configure(cache="node-local")  # what SharedFSHook(cache="node-local") does in an XTuner config
print(json.dumps({"before": before, "inductor": cache_dir_utils.cache_dir(), "headers": runtime_utils.default_cache_dir(),
                  "extensions": cpp_extension.get_default_build_root()}))
"""


def test_a_later_configure_moves_extension_builds_and_keeps_inductor_where_it_started(tmp_path: Path) -> None:
    """Inductor fixes its directory when it is imported (and exports it to its variable): a later policy
    change must not split it from its precompiled headers; extension builds follow the new policy."""
    (tmp_path / "local").mkdir(mode=0o700)
    env = clean_env({"HOME": str(tmp_path / "home"), "SHAREDFS_CACHE_ROOT": str(tmp_path / "local"),
                     "SHAREDFS_CACHE": "shared"})
    for name in ("TMPDIR", "SLURM_JOB_ID", "TORCHINDUCTOR_CACHE_DIR", "TORCH_EXTENSIONS_DIR"):
        env.pop(name, None)
    done = subprocess.run([sys.executable, "-c", RECONFIGURE], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["inductor"] == seen["before"] == seen["headers"]
    assert seen["extensions"] == str(tmp_path / "local" / f"sharedfs-{os.getuid()}" / "nojob" / "torch.cpp_ext")


COMPILE = """
import torch
def f(x):
    return torch.sin(x) * 2 + 1
x = torch.arange(8, dtype=torch.float32)
assert torch.allclose(torch.compile(f)(x), f(x))
print("compiled")
"""


def test_torch_compile_with_its_cache_on_lustre_without_flock_fails_without_sharedfs_and_works_with_it(
    hostile_mount,
) -> None:
    """Inductor's locks are flock (torch.utils._filelock); on ENOSYS filelock >= 3.24 swaps the lock's class
    for SoftFileLock mid-acquire and torch's subclass then fails in its own __exit__ (older filelock raises
    "FileSystem does not appear to support flock")."""
    lustre = hostile_mount("lustre-noflock").path
    base = {"TORCHINDUCTOR_COMPILE_THREADS": "1"}  # no compile-worker pool: half the time on 2 cores

    plain = subprocess.run([sys.executable, "-c", COMPILE], capture_output=True, text=True, timeout=240,
                           env=clean_env({**base, "SHAREDFS_DISABLE": "1",
                                          "TORCHINDUCTOR_CACHE_DIR": str(lustre / "plain")}))
    assert plain.returncode != 0
    assert ("super(type, obj): obj must be an instance or subtype of type" in plain.stderr
            or "does not appear to support flock" in plain.stderr), plain.stderr[-3000:]

    fixed = subprocess.run([sys.executable, "-c", COMPILE], capture_output=True, text=True, timeout=240,
                           env=clean_env({**base, "SHAREDFS_LOG": "info",
                                          "TORCHINDUCTOR_CACHE_DIR": str(lustre / "fixed")}))
    assert fixed.returncode == 0 and "compiled" in fixed.stdout, fixed.stderr[-3000:]
    assert "torch locks -> soft: existence lock on fuse" in fixed.stderr


LAZY_LOCKS = """
import json, sys
import torch
from torch.utils.data import DataLoader


def seen():
    return {"filelock": "filelock" in sys.modules, "sharedfs.locks": "sharedfs.locks" in sys.modules,
            "sharedfs loaded": "sharedfs.activation" in sys.modules,
            "DataLoader patched": DataLoader.__init__.__code__.co_filename.endswith("shims/torch.py")}


at_import = seen()
import webdataset  # a shim that claims datasets: sharedfs loads, and the DataLoader cap with it
after_webdataset = seen()
import torch.utils._filelock as tfl
print(json.dumps({"at_import": at_import, "after_webdataset": after_webdataset,
                  "is drop-in": tfl.FileLock.__module__.startswith("sharedfs")}))
"""


def test_import_torch_loads_nothing_of_sharedfs_until_a_shim_that_needs_it(tmp_path: Path) -> None:
    """``import torch`` loads neither sharedfs (its DataLoader cap acts only on datasets a framework shim
    claimed) nor filelock (44 M instructions); importing webdataset then applies the cap to the DataLoader
    class already bound, and torch's lock module still gets sharedfs's FileLock (issue: imports stay fast;
    the torch shim used to load pluggy, the plugins and the policy, ~20 ms, at `import torch`)."""
    out = subprocess.run([sys.executable, "-c", LAZY_LOCKS], capture_output=True, text=True, timeout=120,
                         env=clean_env({"SHAREDFS_CACHE_ROOT": str(tmp_path)}), cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["at_import"] == {"filelock": False, "sharedfs.locks": False, "sharedfs loaded": False,
                                 "DataLoader patched": False}, seen
    assert seen["after_webdataset"]["sharedfs loaded"] and seen["after_webdataset"]["DataLoader patched"], seen
    assert seen["is drop-in"], seen


#: A site's own shim for torch (a third-party plugin, entry point group ``sharedfs``): it marks torch.hub.
SITE_SHIM = """
from sharedfs.hookspecs import hookimpl
from sharedfs.shim import Shim


class HubShim(Shim):
    name = "mysite_torch_hub"
    target = "torch.hub"  # imported by `import torch`
    distribution = "torch"
    supported = ">=1.13"

    def apply(self, module, policy, context):
        self.patcher.setattr(module, "MYSITE_PATCHED", True)


@hookimpl
def sharedfs_register_shims():
    return [HubShim()]
"""


def test_import_torch_applies_a_third_party_shim_for_torch(tmp_path: Path) -> None:
    """The built-in DataLoader cap waits for another shim, but a site's own shim for a torch module must not:
    with a ``sharedfs`` entry point installed, ``import torch`` loads sharedfs, which learns the plugin's
    targets and patches them (deferring unconditionally left torch.hub unpatched until some other framework
    was imported, and for ever in a torch-only job)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "mysite_torch.py").write_text(SITE_SHIM)
    meta = site / "mysite_torch-1.0.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: mysite-torch\nVersion: 1.0\n")
    (meta / "entry_points.txt").write_text("[sharedfs]\nmysite_torch = mysite_torch\n")
    probe = "import json, sys, torch; print(json.dumps([getattr(torch.hub, 'MYSITE_PATCHED', False), " \
            "'sharedfs.activation' in sys.modules]))"
    env = clean_env({"SHAREDFS_CACHE_ROOT": str(tmp_path / "cache"), "PYTHONPATH": str(site)})
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=env,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [True, True], out.stderr[-3000:]

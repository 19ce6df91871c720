"""User stories of the torch shims: real torch 2.x on CPU, a real C++ extension built by ninja and g++, real kills.

``torch.utils.cpp_extension.load()`` is how DeepSpeed (and so XTuner) JIT-compiles its ops.
The extension is ``sharedfs/demo/torch_ext/answer.cpp`` (Python.h only: it builds in
under a second); the compiler is a wrapper that counts compilations and can be held
mid-compile, so "killed half-way through the build" is exact
(:mod:`sharedfs.demo.scenario_torch`).  Each test reproduces the failure first where
one exists, then shows the fix.

Which failure a test shows is the one the *installed* torch and filelock have
(``scenario_torch.case_for``, from their metadata), and the test id names it: torch < 2.14
builds under a ``FileBaton`` a killed builder leaves behind (pytorch#189245); torch >= 2.14
holds filelock's flock, fixed upstream on a local disk (ids say "fixed-upstream-in-torch-2.14")
but failing on NFS without lockd (ENOLCK), on Lustre without ``-o flock`` (ENOSYS: what the
installed filelock does there) and on GPFS-like node-local flock.  The compatibility
matrix runs this file on both, so every case runs on the release it applies to; none is
skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness.skips import skip_or_fail
from helpers import clean_env, require

from sharedfs.demo.nodes import node_env, run_on_nodes
from sharedfs.demo.scenario_torch import (
    EXTENSION,
    FIXED_UPSTREAM,
    LOAD,
    SOURCE,
    Case,
    Toolchain,
    ToolchainMissing,
    answer,
    builds_under_filelock,
    case_for,
    filelock_on_enosys,
    finish,
    kill_mid_build,
    run_case,
    run_load,
    start_load,
    toolchain,
)

pytestmark = pytest.mark.slow
require("torch", "the torch shims are tested against real torch")

#: How long a load() must keep waiting to count as "waits forever" (a rerun takes about 3 s here).
HANG = 8.0
#: The installed torch builds extensions under filelock's lock (>= 2.14), not a FileBaton.
FILELOCK_BUILDS = builds_under_filelock()
#: The era of the installed torch, as test ids say it.
ERA = "torch>=2.14" if FILELOCK_BUILDS else "torch<2.14"
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


LOCAL = case_for(None)


@pytest.mark.parametrize("case", [LOCAL], ids=[LOCAL.id])
def test_a_build_killed_half_way_hangs_every_later_load_without_sharedfs_and_is_rebuilt_with_it(
    tmp_path: Path, case: Case
) -> None:
    """pytorch#189245 on one node, as ``sharedfs demo`` shows it.  torch < 2.14: the killed builder's
    <build_dir>/lock stays and torch's FileBaton.wait() spins forever; with sharedfs the rerun breaks it (its
    holder is gone) and builds.  torch >= 2.14 fixed it (a flock, which the kernel drops): the side without
    sharedfs must recover by itself, and the id and the evidence say "fixed upstream"."""
    try:
        result = run_case(case, tmp_path, tmp_path, clean_env(), hang_after=HANG)
    except ToolchainMissing as exc:
        skip_or_fail(str(exc))
    plain = tmp_path / "without" / "torch_extensions" / EXTENSION / "lock"
    if case.fixed_upstream:
        assert FIXED_UPSTREAM == "fixed upstream in torch 2.14 (sharedfs keeps older releases safe)"
        assert result.ok_without and "pytorch#189245's fix" in result.without, result
    else:
        assert not result.ok_without and "waits for it forever" in result.without, result
        assert plain.exists() and plain.stat().st_size == 0

    assert result.ok_with and "rebuilt" in result.with_sharedfs, result
    if not FILELOCK_BUILDS:  # the baton is released for plain torch too (torch >= 2.14's flock file stays, as torch's)
        assert not (tmp_path / "with" / "torch_extensions" / EXTENSION / "lock").exists()
    # Each killed build compiled once, and so did each rerun that loaded: the half-built extension was rebuilt,
    # never loaded (the rerun without sharedfs compiles only where torch recovers by itself).
    compiles = len((tmp_path / "toolchain" / "compiles.log").read_text().split())
    assert compiles == (4 if case.fixed_upstream else 3), compiles


CLUSTER = [case_for(profile) for profile in ("nfs-nolock", "lustre-noflock", "localflock")]


@pytest.mark.parametrize("case", CLUSTER, ids=[f"{ERA}-{case.id}" for case in CLUSTER])
def test_the_build_lock_on_cluster_storage_fails_as_the_installed_releases_do_and_works_with_sharedfs(
    tmp_path: Path, hostile_mount, case: Case
) -> None:
    """What each cluster filesystem does to torch's build lock with the installed torch and filelock, first
    without sharedfs, then with it: torch < 2.14, the stale baton of a killed builder on every one of them;
    torch >= 2.14, ENOLCK on NFS without lockd (every load(), the first build included), Lustre without
    ``-o flock`` (ENOSYS: filelock >= 4.3 leaves a soft lock behind a killed builder that hangs the rerun even on
    its node; older filelock fails the first load()), and GPFS-like node-local flock (two nodes compile into one
    build directory at once)."""
    root = hostile_mount(case.profile).path
    try:
        result = run_case(case, tmp_path, root, clean_env(), hang_after=HANG)
    except ToolchainMissing as exc:
        skip_or_fail(str(exc))
    assert not result.ok_without and case.expect in result.without, result
    assert result.ok_with, result
    if case.story == "two-nodes":
        assert "1 compilation for 2 nodes" in result.with_sharedfs, result
    elif case.story == "killed":
        assert "rebuilt" in result.with_sharedfs, result
        leftovers = sorted(p.name for p in (root / "with" / "torch_extensions" / EXTENSION).iterdir()
                           if p.name.startswith("lock"))
        # sharedfs's own marker and second names are gone; torch's flock file may stay (as torch leaves it).
        assert set(leftovers) <= {"lock"}, leftovers


ANOTHER_NODE = case_for("lustre-noflock")


@pytest.mark.parametrize("case", [ANOTHER_NODE], ids=[f"{ERA}-{ANOTHER_NODE.id}"])
def test_a_build_killed_on_another_node_is_rebuilt_once_slurm_says_its_job_ended(
    tmp_path: Path, chain: Toolchain, hostile_mount, case: Case
) -> None:
    """Lustre without flock, two nodes: node a's job is cancelled mid-build; node b's load() must not hang.

    Without sharedfs, what the installed releases do: torch < 2.14 waits for the baton forever; torch >= 2.14
    with filelock >= 4.3 waits forever for the soft lock the killed builder left (filelock breaks it only on its
    own host, by an exchange this filesystem refuses); older filelock fails the build itself."""
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
        try:
            kill_mid_build(chain, on_a)
        except RuntimeError as exc:  # filelock < 3.24 fails the build before it compiles
            assert side == "plain" and case.expect in str(exc), exc
            continue
        rerun = run_load(on_b, HANG if side == "plain" else 60)
        if side == "plain":
            if case.story == "killed":
                assert rerun is None, "torch without sharedfs should wait forever for node a's dead builder"
            else:  # filelock 3.24-4.2: the rerun builds, then torch's FileLock subclass fails in __exit__
                assert rerun is not None and not loaded(rerun) and case.expect in rerun.stderr, rerun
        else:
            assert rerun is not None and loaded(rerun), rerun
            if FILELOCK_BUILDS:  # the sharedfs lock names its dead holder, and torch's own lock file is taken over
                assert "its holder (pid" in rerun.stderr and "on node a, Slurm job 4242" in rerun.stderr, rerun.stderr
                assert "left by a sharedfs builder that is gone" in rerun.stderr, rerun.stderr
            else:
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


def builds_beside(chain: Toolchain, builder_env: dict[str, str], waiter_env: dict[str, str], *,
                  window: float = 6.0) -> bool:
    """Start a build (held mid-compile), then a second load() of the same extension: does the second compile
    while the first builds?  When it does not, both must load the extension in the end (when it does, either may
    fail: two compilers and linkers wrote one build directory, "file too short" is one way it ends)."""
    before = chain.compiles()
    chain.hold()
    try:
        builder = start_load(builder_env)
        deadline = time.monotonic() + 60
        while chain.compiles() == before:
            assert builder.poll() is None, builder.communicate()
            assert time.monotonic() < deadline, "the first build did not start compiling within 60 s"
            time.sleep(0.05)
        waiter = start_load(waiter_env)
        deadline = time.monotonic() + window  # long enough to import torch and reach the lock (ends if it compiles)
        while chain.compiles() == before + 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        beside = chain.compiles() > before + 1
        assert beside or waiter.poll() is None, "the second load() must wait for the live build, not fail"
    finally:
        chain.let_go()
    done = [finish(builder, 60), finish(waiter, 60)]
    if not beside:
        assert all(loaded(d) for d in done), [d and d.stderr[-2000:] for d in done]
        assert chain.compiles() == before + 1
    return beside


#: Where torch without sharedfs and torch with it share a build directory: torch < 2.14's baton on the local
#: disk; torch >= 2.14's lock file where the two would otherwise lock different files -- its existence (Lustre
#: without flock, ENOSYS) and flock (GPFS-like localflock, two processes of one node).  On a local disk, torch
#: >= 2.14 and sharedfs both flock the same file: nothing to show; NFS without lockd fails torch itself.
MIXED = ["lustre-noflock", "localflock"] if FILELOCK_BUILDS else [None]


@pytest.mark.parametrize("profile", MIXED, ids=[f"{ERA}-{profile or 'local-disk'}" for profile in MIXED])
def test_torch_without_sharedfs_in_the_same_directory_waits_for_sharedfs_and_is_waited_for(
    tmp_path: Path, chain: Toolchain, hostile_mount, profile: str | None
) -> None:
    """A second environment (or SHAREDFS_DISABLE) sharing TORCH_EXTENSIONS_DIR: neither builds beside the other.

    torch >= 2.14 first shows the failure sharedfs closes here: its own lock alone (SHAREDFS_DISABLE=torch.cpp_ext
    leaves cpp_extension the torch.filelock shim's drop-in, a marker beside torch's file) is invisible to torch
    without sharedfs, which then compiles beside it; the torch.cpp_ext shim also holds torch's own lock file."""
    root = tmp_path if profile is None else hostile_mount(profile).path
    if FILELOCK_BUILDS:
        env = chain.env(clean_env({"SHAREDFS_DISABLE": "torch.cpp_ext"}), root / "drop-in-only")
        assert builds_beside(chain, env, chain.env(clean_env({"SHAREDFS_DISABLE": "1"}), root / "drop-in-only"),
                             window=30), \
            "torch without sharedfs should compile beside a lock it does not see"
    for builder_extra, waiter_extra in (({"SHAREDFS_DISABLE": "1"}, {}), ({}, {"SHAREDFS_DISABLE": "1"})):
        where = root / ("plain-builds" if builder_extra else "sharedfs-builds")
        assert not builds_beside(chain, chain.env(clean_env(builder_extra), where),
                                 chain.env(clean_env(waiter_extra), where)), \
            "the second process must wait for the live build, not build beside it"
    if profile == "lustre-noflock":  # nothing of sharedfs's is left beside torch's file
        left = sorted(p.name for p in (root / "sharedfs-builds" / EXTENSION).iterdir() if p.name.startswith("lock"))
        assert left == [], left


LATE_ENABLE = """
import json, sys, sharedfs
sharedfs.disable()  # as if sharedfs came later: cpp_extension binds its build lock class at its import
from torch.utils import cpp_extension
name = "FileBaton" if "FileBaton" in cpp_extension._jit_compile.__code__.co_names else "FileLock"
seen = {"before": getattr(cpp_extension, name).__module__}
sharedfs.enable()
seen["after"] = getattr(cpp_extension, name).__module__
seen["answer"] = cpp_extension.load(sys.argv[1], [sys.argv[2]]).answer()
sharedfs.disable()
seen["disabled"] = getattr(cpp_extension, name).__module__
print(json.dumps(seen))
"""
#: The failure a late sharedfs.enable() must fix: torch >= 2.14 on NFS without lockd; torch < 2.14, the baton
#: a killed builder left.
LATE = case_for("nfs-nolock") if FILELOCK_BUILDS else case_for(None)


@pytest.mark.parametrize("case", [LATE], ids=[f"{ERA}-{LATE.id}"])
def test_sharedfs_enable_after_cpp_extension_was_imported_takes_over_its_build_lock(
    tmp_path: Path, chain: Toolchain, hostile_mount, case: Case
) -> None:
    """cpp_extension binds its build lock class by name at its import (torch >= 2.14: ``from ._filelock import
    FileLock``), so ``sharedfs.enable()`` after that import must rebind it there, and ``sharedfs.disable()`` give
    torch's own back.  First the failure without sharedfs, then the same load() after a late enable()."""
    root = (tmp_path if case.profile is None else hostile_mount(case.profile).path) / "extensions"
    if case.story == "killed":  # a sharedfs builder killed half-way leaves its baton; torch alone waits forever
        kill_mid_build(chain, chain.env(clean_env(), root))
        assert run_load(chain.env(clean_env({"SHAREDFS_DISABLE": "1"}), root), HANG) is None
    else:
        plain = run_load(chain.env(clean_env({"SHAREDFS_DISABLE": "1"}), root), 120)
        assert plain is not None and not loaded(plain) and case.expect in plain.stderr, plain
    done = subprocess.run([sys.executable, "-c", LATE_ENABLE, EXTENSION, str(SOURCE)], capture_output=True, text=True,
                          env=chain.env(clean_env(), root), timeout=180, cwd="/")
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"before": TORCH_BUILD_LOCK, "after": "sharedfs.shims.torch", "answer": 42,
                    "disabled": TORCH_BUILD_LOCK}, seen


PLACES = """
import json
from torch.utils import cpp_extension
from torch._inductor.runtime import cache_dir_utils
# The build lock _jit_compile takes: a FileBaton before torch 2.14, torch.utils._filelock.FileLock from 2.14 on.
lock = cpp_extension.FileBaton if "FileBaton" in cpp_extension._jit_compile.__code__.co_names else cpp_extension.FileLock
print(json.dumps({"extensions": cpp_extension._get_build_directory("x", False), "inductor": cache_dir_utils.cache_dir(),
                  "build lock": lock.__module__}))
"""
#: The module torch's own build lock class lives in.
TORCH_BUILD_LOCK = "torch.utils._filelock" if FILELOCK_BUILDS else "torch.utils.file_baton"


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
    assert moved["build lock"] == "sharedfs.shims.torch"

    kept = places({"SHAREDFS_CACHE": "node-local", "TORCH_EXTENSIONS_DIR": str(tmp_path / "mine"),
                   "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}, tmp_path)
    assert kept["extensions"] == str(tmp_path / "mine" / "x") and kept["inductor"] == str(tmp_path / "inductor")

    # auto: the extensions keep torch's default in the home directory (every lock there is sharedfs's now);
    # Inductor's default is a fixed name in /tmp, which every user can create first: it moves.
    auto = places({}, tmp_path)
    assert auto["extensions"].startswith(str(tmp_path / "home" / ".cache" / "torch_extensions") + "/")
    assert auto["inductor"] == str(local / "torch.inductor")

    off = places({"SHAREDFS_DISABLE": "torch", "SHAREDFS_CACHE": "node-local"}, tmp_path)
    assert off["build lock"] == TORCH_BUILD_LOCK and off["extensions"].startswith(str(tmp_path / "home"))


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


def inductor_failures() -> list[tuple[str, str, str | None]]:
    """(id, profile, what fails without sharedfs) for Inductor's locks with the installed filelock; ``None``:
    fixed upstream (the program must succeed without sharedfs too)."""
    enosys = {"raises": ("ENOSYS-raises", "does not appear to support flock"),
              "swaps-class": ("ENOSYS-class-swap", "super(type, obj): obj must be an instance or subtype of type"),
              "soft-fallback": ("ENOSYS-fixed-upstream-in-filelock-4.3", None)}[filelock_on_enosys()]
    return [("nfs-nolock-ENOLCK", "nfs-nolock", "No locks available"), (f"lustre-noflock-{enosys[0]}",
                                                                          "lustre-noflock", enosys[1])]


INDUCTOR = inductor_failures()


@pytest.mark.long
@pytest.mark.parametrize(("profile", "failure"), [(p, f) for _, p, f in INDUCTOR], ids=[i for i, _, _ in INDUCTOR])
def test_torch_compile_with_its_cache_on_cluster_storage_fails_without_sharedfs_and_works_with_it(
    hostile_mount, profile: str, failure: str | None
) -> None:
    """Inductor's locks are flock (torch.utils._filelock), and fail as the installed filelock fails: NFS without
    lockd raises ENOLCK with every filelock; on Lustre without flock (ENOSYS) filelock 3.24-4.2 swaps the lock's
    class for SoftFileLock mid-acquire and torch's subclass then fails in its own __exit__, older filelock raises
    "FileSystem does not appear to support flock", and filelock >= 4.3 falls back without either (fixed upstream:
    the program must then succeed without sharedfs as well)."""
    mount = hostile_mount(profile).path
    base = {"TORCHINDUCTOR_COMPILE_THREADS": "1"}  # no compile-worker pool: half the time on 2 cores

    plain = subprocess.run([sys.executable, "-c", COMPILE], capture_output=True, text=True, timeout=240,
                           env=clean_env({**base, "SHAREDFS_DISABLE": "1",
                                          "TORCHINDUCTOR_CACHE_DIR": str(mount / "plain")}))
    if failure is None:
        assert plain.returncode == 0 and "compiled" in plain.stdout, plain.stderr[-3000:]
    else:
        assert plain.returncode != 0 and failure in plain.stderr, plain.stderr[-3000:]

    fixed = subprocess.run([sys.executable, "-c", COMPILE], capture_output=True, text=True, timeout=240,
                           env=clean_env({**base, "SHAREDFS_LOG": "info",
                                          "TORCHINDUCTOR_CACHE_DIR": str(mount / "fixed")}))
    assert fixed.returncode == 0 and "compiled" in fixed.stdout, fixed.stderr[-3000:]
    assert "torch locks -> soft: existence lock on fuse" in fixed.stderr


LAZY_LOCKS = """
import json, sys
import torch
from torch.utils.data import DataLoader


def seen():
    return {"filelock": "filelock" in sys.modules, "sharedfs.locks": "sharedfs.locks" in sys.modules,
            "sharedfs loaded": "sharedfs.startup.activation" in sys.modules,
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
from sharedfs.machinery.hookspecs import hookimpl
from sharedfs.machinery.shimbase import Shim


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
            "'sharedfs.startup.activation' in sys.modules]))"
    env = clean_env({"SHAREDFS_CACHE_ROOT": str(tmp_path / "cache"), "PYTHONPATH": str(site)})
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=env,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [True, True], out.stderr[-3000:]

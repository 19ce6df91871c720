"""The placed-cache table (``sharedfs.model.caches``): each library's cache variable, placed per node when its
default is on a shared filesystem, never touched when the user set it or the default is local.

Each test runs a program in a child process as a job would (``import triton``: sharedfs activates, nothing of
it is called), first with ``SHAREDFS_DISABLE=1`` (every cache in the shared home), then with sharedfs.
Triton's row is checked against the real library (its ``FileCacheManager`` writes there); the other rows by
their exported variables only (the libraries are GPU-only or not installed here).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import clean_env, require

from sharedfs.model.caches import PLACED_CACHES
from sharedfs.types import CachePlacement, CacheRequest, Policy, hookimpl

require("triton", "needs triton==3.9.0 (scripts/requirements-test.txt)")

pytestmark = pytest.mark.slow

# A job's program: imports Triton (sharedfs activates), compiles into Triton's cache through its own API,
# starts a child the way a compile worker is started (python -S: no sharedfs in it) and reports what each saw.
PROGRAM = textwrap.dedent("""
    import hashlib, json, os, subprocess, sys
    import triton
    from triton.runtime.cache import get_cache_manager
    manager = get_cache_manager(hashlib.sha256(b"a kernel").hexdigest())
    manager.put(b"\\x7fELF", "k.cubin")
    names = json.loads(sys.argv[1])
    child = subprocess.run([sys.executable, "-S", "-c",
                            "import json, os, sys; print(json.dumps({n: os.environ.get(n) for n in sys.argv[1:]}))",
                            *names], capture_output=True, text=True, check=True)
    print(json.dumps({"here": {n: os.environ.get(n) for n in names}, "child": json.loads(child.stdout),
                      "triton_dir": os.path.dirname(manager.cache_dir)}))
""")
VARIABLES = [row.variable for row in PLACED_CACHES]


def _run(home: Path, **extra: str) -> tuple[dict, str]:
    env = clean_env({"HOME": str(home), "SHAREDFS_NODE_ID": "n0", "SHAREDFS_LOG": "info", **extra})
    for name in ("XDG_CACHE_HOME", *VARIABLES, "TRITON_HOME"):
        if name not in extra:
            env.pop(name, None)
    out = subprocess.run([sys.executable, "-c", PROGRAM, json.dumps(VARIABLES)], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def _env_command(home: Path) -> dict[str, str]:
    env = clean_env({"HOME": str(home), "SHAREDFS_NODE_ID": "n0"})
    for name in ("XDG_CACHE_HOME", *VARIABLES, "TRITON_HOME"):
        env.pop(name, None)
    out = subprocess.run([sys.executable, "-m", "sharedfs", "env", "--json"], capture_output=True, text=True,
                         env=env, timeout=120, check=True)
    return json.loads(out.stdout)


def test_a_shared_home_gets_one_directory_per_node_exported_to_children_and_by_sharedfs_env(hostile_mount) -> None:
    home = Path(hostile_mount("plain").path)  # FUSE: a filesystem the plugins classify as shared

    stock, _ = _run(home, SHAREDFS_DISABLE="1")
    assert stock["here"] == dict.fromkeys(VARIABLES) and stock["child"] == stock["here"], stock
    assert stock["triton_dir"] == str(home / ".triton" / "cache"), stock  # every node's ranks in one directory

    placed, log = _run(home)
    expected = {
        "TRITON_CACHE_DIR": f"{home}/.triton/cache/n0",
        "DG_JIT_CACHE_DIR": f"{home}/.deep_gemm/n0",
        "FLASHINFER_WORKSPACE_BASE": f"{home}/.cache/flashinfer/n0",  # its cache: <base>/.cache/flashinfer
        "TILELANG_CACHE_DIR": f"{home}/.tilelang/cache/n0",
        "MIOPEN_USER_DB_PATH": f"{home}/.config/miopen/n0",
        "HF_XET_CACHE": f"{home}/.cache/huggingface/xet/n0",
        "TVM_FFI_CACHE_DIR": f"{home}/.cache/tvm-ffi/n0",
        "VLLM_CACHE_ROOT": f"{home}/.cache/vllm/n0",
        "EP_JIT_CACHE_DIR": f"{home}/.deep_ep/n0",
        "PYTORCH_KERNEL_CACHE_PATH": f"{home}/.cache/torch/kernels/n0",
    }
    assert placed["here"] == expected, placed
    assert placed["child"] == expected, placed  # a worker started without sharedfs inherits the placement
    assert placed["triton_dir"] == expected["TRITON_CACHE_DIR"], placed  # the real library uses it
    assert (Path(expected["TRITON_CACHE_DIR"])).is_dir()
    # torch turns its kernel cache off rather than make the directory its variable names: sharedfs made it
    assert Path(expected["PYTORCH_KERNEL_CACHE_PATH"]).is_dir()
    assert log.count("triton cache -> ") == 1, log
    assert {k: v for k, v in _env_command(home).items() if k in VARIABLES} == expected  # the same exports


def test_a_variable_the_user_set_is_never_touched_and_one_line_says_what_sharedfs_would_have_done(
        hostile_mount, tmp_path: Path) -> None:
    home = Path(hostile_mount("plain").path)
    mine = str(tmp_path / "my-triton-cache")

    stock, _ = _run(home, SHAREDFS_DISABLE="1", TRITON_CACHE_DIR=mine)
    assert stock["here"]["TRITON_CACHE_DIR"] == mine and stock["triton_dir"] == mine, stock

    kernels = str(tmp_path / "my-kernels")  # torch's: its directory is the user's to make, even where sharedfs makes it
    kept, log = _run(home, TRITON_CACHE_DIR=mine, PYTORCH_KERNEL_CACHE_PATH=kernels)
    assert kept["here"]["TRITON_CACHE_DIR"] == mine and kept["child"]["TRITON_CACHE_DIR"] == mine, kept
    assert kept["here"]["PYTORCH_KERNEL_CACHE_PATH"] == kernels and not Path(kernels).exists(), kept
    assert kept["triton_dir"] == mine, kept
    said = [line for line in log.splitlines() if "TRITON_CACHE_DIR=" in line and "left as it is" in line]
    assert len(said) == 1 and f"{home}/.triton/cache/n0" in said[0], log
    assert kept["here"]["DG_JIT_CACHE_DIR"] == f"{home}/.deep_gemm/n0", kept  # the other rows are still placed


def test_a_local_home_is_left_as_it_is(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    stock, _ = _run(home, SHAREDFS_DISABLE="1")
    local, log = _run(home)
    assert local == stock and local["here"] == dict.fromkeys(VARIABLES), (local, stock)
    assert " cache -> " not in log, log
    assert not set(_env_command(home)) & set(VARIABLES)


class _SiteRule:
    """A site plugin: Triton's cache goes to the node's scratch disk, whatever the built-in rule says."""

    @hookimpl
    def sharedfs_cache_placement(self, request: CacheRequest, policy: Policy) -> CachePlacement | None:
        if request.per_node and request.framework == "triton":
            return CachePlacement("/scratch/triton", "site rule: kernels on the node's scratch disk")
        return None  # anything else: the built-in rule answers


def test_a_site_plugin_overrules_a_row_and_node_local_moves_every_row(fresh_runtime, monkeypatch,
                                                                      tmp_path: Path) -> None:
    from sharedfs.startup import placedcaches

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in ("XDG_CACHE_HOME", "HF_HOME", "TRITON_HOME", *VARIABLES):
        monkeypatch.delenv(name, raising=False)
    assert placedcaches.exports(fresh_runtime.policy()) == {}  # a local home: nothing placed

    pm = fresh_runtime.registry().pm
    pm.register(_SiteRule(), name="test-site-caches")
    try:
        assert placedcaches.exports(fresh_runtime.policy()) == {"TRITON_CACHE_DIR": "/scratch/triton"}
    finally:
        pm.unregister(name="test-site-caches")

    root = tmp_path / "local"
    root.mkdir(mode=0o700)
    policy = fresh_runtime.configure(cache="node-local", cache_root=str(root))
    placed = placedcaches.exports(policy)
    assert sorted(placed) == sorted(VARIABLES), placed
    assert all(path.startswith(str(root)) and path.endswith("/" + name)
               for name, path in zip([r.name for r in PLACED_CACHES], [placed[v] for v in VARIABLES])), placed

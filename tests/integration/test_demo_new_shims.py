"""`sharedfs demo` for the ModelScope hub lock, Megatron's dataset index cache and tvm-ffi's JIT build lock.

Each test runs the real command (``sharedfs demo --only NAME --json``) as a user does: the stock side
(``SHAREDFS_DISABLE=1``) must fail the way the field reports say, and the sharedfs side must succeed,
with the evidence naming what each run observed.  The programs are
:mod:`sharedfs.demo.scenario_modelscope`, :mod:`~sharedfs.demo.scenario_megatron` and
:mod:`~sharedfs.demo.scenario_tvm_ffi`, which the shims' own tests run too.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import metadata

import pytest
from harness.skips import skip_or_fail
from helpers import clean_env

pytestmark = pytest.mark.slow

MODELSCOPE = "ModelScope download on NFS without lockd (ENOLCK)"
MEGATRON = "Megatron index after a killed rank 0"
TVM_FFI = "tvm-ffi JIT build on NFS without lockd (ENOLCK)"


def installed(distribution: str) -> None:
    """Skip (fail under CI) without ``distribution``; not imported here: megatron.core warns at import."""
    try:
        metadata.version(distribution)
    except metadata.PackageNotFoundError:
        skip_or_fail(f"the scenario needs {distribution} (scripts/requirements-test.txt)")


def only(name: str, *args: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "sharedfs", "demo", "--json", "--only", name, *args], check=False,
                          capture_output=True, text=True, env=clean_env(), timeout=600, cwd="/tmp")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (scenario,) = json.loads(proc.stdout)["scenarios"]
    assert scenario["name"] == name and scenario["error"] is None and scenario["skipped"] is None, scenario
    assert scenario["without"]["failed"] and not scenario["with_sharedfs"]["failed"], scenario
    assert scenario["fixed"] and scenario["verdict"] == "fixed", scenario
    print(f"{name}: without: {scenario['without']['evidence']}; with: {scenario['with_sharedfs']['evidence']}; "
          f"{scenario['seconds']:.1f} s")
    return scenario


@pytest.mark.parametrize("mode", [(), ("--no-fuse",)], ids=["fuse", "preload"])
def test_modelscope_on_nfs_without_lockd_fails_every_download_stock_and_none_with_sharedfs(mode: tuple[str]) -> None:
    installed("modelscope-hub")
    scenario = only(MODELSCOPE, *mode)
    assert scenario["without"]["evidence"] == "0/4 downloads on 2 nodes completed; OSError: [Errno 37] No locks " \
                                              "available", scenario
    # The cause names the lock the run imported: the hub's own, not sharedfs's.
    assert scenario["cause"].startswith("4 of 4 downloads failed in the hub's download lock "
                                        "(modelscope_hub._download._optional_file_lock)"), scenario
    assert scenario["with_sharedfs"]["evidence"] == "4/4 downloads on 2 nodes completed", scenario


def test_megatron_index_cut_short_by_a_killed_rank_0_fails_the_rerun_stock_and_is_rebuilt_with_sharedfs() -> None:
    installed("megatron-core")
    scenario = only(MEGATRON)
    without, with_ = scenario["without"]["evidence"], scenario["with_sharedfs"]["evidence"]
    cut = re.fullmatch(r"shuffle_index\.npy cut at ([\d,]+) bytes by the SIGKILL; the rerun: "
                       r"ValueError: mmap length is greater than file size", without)
    assert cut, without
    rebuilt = re.fullmatch(r"the rerun rebuilt shuffle_index\.npy whole \(([\d,]+) bytes; the killed job's ([\d,]+) "
                           r"refused\) and read a sample \(sharedfs\.shims\.megatron\)", with_)
    assert rebuilt and rebuilt[2] == cut[1], with_
    whole, short = (int(text.replace(",", "")) for text in (rebuilt[1], cut[1]))
    assert 128 < short < whole, (short, whole)  # past numpy's header, short of the whole array
    assert scenario["cause"] == (f"the killed rank 0 left shuffle_index.npy at its final name with {cut[1]} of "
                                 f"{rebuilt[1]} bytes; the rerun's megatron.core.datasets.gpt_dataset took it as "
                                 f"built, still {cut[1]} bytes, and failed: ValueError: mmap length is greater "
                                 "than file size"), scenario


@pytest.mark.parametrize("mode", [(), ("--no-fuse",)], ids=["fuse", "preload"])
def test_tvm_ffi_on_nfs_without_lockd_hangs_every_build_stock_and_none_with_sharedfs(mode: tuple[str]) -> None:
    installed("apache-tvm-ffi")
    scenario = only(TVM_FFI, *mode)
    assert scenario["without"]["evidence"] == ("0/4 processes on 2 nodes built or loaded the module; 0 compiles; "
                                               "4 still waiting 10 s after import (killed)"), scenario
    assert scenario["cause"] == ("4 of 4 processes waited in tvm-ffi's build lock (1 lock file under "
                                 "~/.cache/tvm-ffi, 0 compiles) 10 s after importing tvm-ffi; killed"), scenario
    # FUSE: sharedfs places the default cache per node (one build on each); the local disk of the LD_PRELOAD
    # fallback is not a shared filesystem, so the one cache is kept and built once under sharedfs's lock.
    builds = 1 if mode else 2
    assert scenario["with_sharedfs"]["evidence"] == f"4/4 processes on 2 nodes built or loaded the module; " \
                                                    f"{builds} compile{'s' if builds > 1 else ''}", scenario

"""Scenarios of the frameworks with a module each: torch extensions, team modules, ModelScope, Megatron, tvm-ffi."""

from __future__ import annotations

import shutil
import subprocess
import sys

from .sim import Outcome, ScenarioSkipped, Sim, last_error


def _torch_case(sim: Sim, profile: str | None) -> tuple[Outcome, Outcome]:
    """The failure torch's extension build lock has on ``profile`` (None: the local disk) with the installed
    torch and filelock (:func:`sharedfs.demo.scenario_torch.case_for`), without and with sharedfs."""
    from sharedfs.demo.scenario_torch import ToolchainMissing, case_for, run_case

    sim.counter += 1
    work = sim.work / ("torch-extension" if profile is None else f"torch-extension-{sim.counter}")
    work.mkdir()
    root, env = (work, sim.base_env) if profile is None else sim.shared_dir(profile)
    try:
        result = run_case(case_for(profile), work, root, env, hang_after=5)
    except ToolchainMissing as exc:
        raise ScenarioSkipped(str(exc)) from None
    return Outcome(not result.ok_without, result.without), Outcome(not result.ok_with, result.with_sharedfs)


def torch_extension(sim: Sim) -> tuple[Outcome, Outcome]:
    """A ``cpp_extension.load`` (how DeepSpeed builds its ops) SIGKILLed mid-compile; the rerun must load it."""
    return _torch_case(sim, None)


def torch_extension_enolck(sim: Sim) -> tuple[Outcome, Outcome]:
    """torch >= 2.14 on NFS without lockd: its build lock is filelock's flock, which answers ENOLCK."""
    return _torch_case(sim, "nfs-nolock")


def torch_extension_enosys(sim: Sim) -> tuple[Outcome, Outcome]:
    """torch >= 2.14 on Lustre without ``-o flock``: what the installed filelock does on ENOSYS."""
    from sharedfs.demo.scenario_torch import filelock_on_enosys

    if not sim.fuse and filelock_on_enosys() == "soft-fallback":
        # filelock >= 4.3 breaks a dead holder's soft lock on its own host by exchanging two names, which the
        # local disk under the LD_PRELOAD fallback can do and a FUSE (or NFS) client cannot: nothing to show here.
        why = f" ({sim.why_not_fuse})" if sim.why_not_fuse else ""
        raise ScenarioSkipped(f"needs FUSE{why}: a filesystem that refuses RENAME_EXCHANGE, as a FUSE Lustre client "
                              "does (under the LD_PRELOAD fallback the local disk lets filelock >= 4.3 break the "
                              "killed builder's lock on this host)")
    return _torch_case(sim, "lustre-noflock")


def torch_extension_two_nodes(sim: Sim) -> tuple[Outcome, Outcome]:
    """torch >= 2.14 on GPFS-like storage whose flock excludes one node only: two nodes build at once."""
    return _torch_case(sim, "localflock")


# -- a team's HF_MODULES_CACHE (transformers remote code) ---------------------------------------------


def team_modules(sim: Sim) -> tuple[Outcome, Outcome]:
    """Two real users of a lab's 2775 ``HF_HOME`` load remote-code models: without sharedfs, then with it."""
    from sharedfs.demo import scenario_team_modules as team
    from sharedfs.demo.accounts import UsersUnavailable

    try:
        scratch, (alice, bob) = team.members(sim.stack)
    except UsersUnavailable as exc:
        raise ScenarioSkipped(str(exc)) from None
    outcomes = []
    for label, extra in (("without", {"SHAREDFS_DISABLE": "1"}), ("with", {})):
        got = team.run(scratch, alice, bob, label, {**sim.base_env, **extra})
        # The evidence names HF_HOME, not this machine's scratch directory.
        a, b = (text.replace(str(scratch / f"hf-{label}"), "$HF_HOME")[:200] for text in got)
        outcomes.append(Outcome(not (a.startswith("ok") and b.startswith("ok")), f"alice acc/a: {a}; bob acc/b: {b}"))
    return outcomes[0], outcomes[1]


# -- ModelScope's hub lock and Megatron's dataset index cache ----------------------------------------

#: The ModelScope users of the ENOLCK scenario, per simulated node.
MODELSCOPE_NODES = {"a": 2, "b": 2}


def modelscope_enolck(sim: Sim) -> tuple[Outcome, Outcome]:
    """ModelScope users on 2 nodes download one file into a hub cache on NFS without lockd (modelscope#1778).

    The programs make no ``sharedfs.`` call (:mod:`sharedfs.demo.scenario_modelscope`): only the hub's
    network fetch is replaced, its ``download_file`` and lock are its own (or the modelscope shim's).
    """
    from sharedfs.demo import scenario_modelscope

    path, env = sim.shared_dir("nfs-nolock")
    outcomes = []
    for label, extra in (("without", {"SHAREDFS_DISABLE": "1"}), ("with", {})):
        reports = scenario_modelscope.run(path / f"hub-{label}", MODELSCOPE_NODES, {**env, **extra})
        failed = [r for r in reports if not r["ok"]]
        locks = sorted({str(r["lock"]) for r in reports if r["lock"]})
        evidence = f"{len(reports) - len(failed)}/{len(reports)} downloads on 2 nodes completed"
        cause = ""
        if failed:
            first = str(failed[0]["error"]).replace(f"{path}/", "")
            evidence += f"; {first[:120]}"
            cause = (f"{len(failed)} of {len(reports)} downloads failed in the hub's download lock "
                     f"({', '.join(locks) or 'none imported'}._optional_file_lock); the first: {first[:100]}")
        outcomes.append(Outcome(bool(failed), evidence, cause=cause))
    return outcomes[0], outcomes[1]


def megatron_killed_rank0(sim: Sim) -> tuple[Outcome, Outcome]:
    """Rank 0 of a Megatron job is SIGKILLed while ``numpy.save`` writes its shuffle index; then the rerun.

    megatron-core on CPU, gloo (:mod:`sharedfs.demo.scenario_megatron`).  The killed job runs stock
    (what a job that ran before sharedfs, or without it, leaves); each rerun gets a copy of its cache,
    stock and with sharedfs, both at once.
    """
    from sharedfs.demo import scenario_megatron as megatron

    work = sim.work / "megatron"
    work.mkdir()
    prefix = str(work / "tiny")
    prepared = subprocess.run([sys.executable, "-m", megatron.__name__, "prepare", prefix], capture_output=True,
                              text=True, env=sim.base_env, cwd="/", timeout=120, check=False)
    if prepared.returncode:
        raise RuntimeError(f"megatron could not write the tiny indexed dataset: {last_error(prepared)}")
    short = megatron.kill_while_writing(work / "killed", prefix, {**sim.base_env, "SHAREDFS_DISABLE": "1"})
    cut = short.stat().st_size
    jobs = []
    for label, extra in (("without", {"SHAREDFS_DISABLE": "1"}), ("with", {})):
        shutil.copytree(work / "killed", work / label)
        jobs.append(megatron.start_job(str(work / label), prefix, megatron.MANY, ["a"], {**sim.base_env, **extra}))
    reports = [megatron.finish(job)[0] for job in jobs]
    rebuilt = (work / "with" / short.name).stat().st_size
    whole = f"{rebuilt:,}" if reports[1]["ok"] else "?"
    outcomes = []
    for report, label in zip(reports, ("without", "with")):
        size = (work / label / short.name).stat().st_size
        where = f"{report.get('build') or 'megatron'}"
        if report["ok"]:
            built = f"rebuilt shuffle_index.npy whole ({size:,} bytes; the killed job's {cut:,} refused)" \
                if size != cut else f"kept shuffle_index.npy ({size:,} bytes)"
            outcomes.append(Outcome(False, f"the rerun {built} and read a sample ({where})"))
            continue
        error = str(report["error"]).replace(f"{work}/", "")
        outcomes.append(Outcome(True, f"shuffle_index.npy cut at {cut:,} bytes by the SIGKILL; the rerun: "
                                      f"{error[:120]}",
                                cause=f"the killed rank 0 left shuffle_index.npy at its final name with {cut:,} of "
                                      f"{whole} bytes; the rerun's {where} took it as built, still {size:,} bytes, "
                                      f"and failed: {error[:100]}"))
    return outcomes[0], outcomes[1]


#: A tvm-ffi process still running this long after every process imported tvm-ffi counts as hung: stock tvm-ffi
#: retries ENOLCK every 0.1 s, forever.  With sharedfs one process builds (2-15 s here, more on a loaded machine)
#: and the others wait for it, so they get a minute, as a torch build that recovers does.
TVM_FFI_HUNG_AFTER = 10.0
TVM_FFI_BUILD_BOUND = 60.0
TVM_FFI_NODES = {"a": 2, "b": 2}


def tvm_ffi_enolck(sim: Sim) -> tuple[Outcome, Outcome]:
    """tvm-ffi users on 2 nodes ``load_inline`` one function with HOME on NFS without lockd (tvm-ffi#667).

    The programs make no ``sharedfs.`` call (:mod:`sharedfs.demo.scenario_tvm_ffi`): tvm-ffi's own cache
    directory, build lock, ninja and compiler.
    """
    from sharedfs.demo import scenario_tvm_ffi

    missing = scenario_tvm_ffi.missing_tools()
    if missing:
        raise ScenarioSkipped(f"tvm-ffi builds with ninja and a C++ compiler; missing here: {', '.join(missing)} "
                              "(apt-get install ninja-build g++)")
    path, env = sim.shared_dir("nfs-nolock")
    count = sum(TVM_FFI_NODES.values())
    outcomes = []
    for label, extra, bound in (("without", {"SHAREDFS_DISABLE": "1"}, TVM_FFI_HUNG_AFTER),
                                ("with", {}, TVM_FFI_BUILD_BOUND)):
        home, work = path / f"home-{label}", sim.work / f"tvm-ffi-{label}"
        home.mkdir()
        work.mkdir()
        reports, compiles = scenario_tvm_ffi.run(home, work, TVM_FFI_NODES, {**env, **extra}, hung_after=bound)
        hung = sum(1 for r in reports if r.get("hung"))
        failed = [str(r["error"]) for r in reports if not r["ok"] and not r.get("hung")]
        builds = sum(compiles.values())
        locks = sorted(home.glob(".cache/tvm-ffi/**/lock"))
        evidence = (f"{count - hung - len(failed)}/{count} processes on 2 nodes built or loaded the module; "
                    f"{builds} compile{'s' if builds != 1 else ''}")
        cause = ""
        if hung:
            evidence += f"; {hung} still waiting {bound:.0f} s after import (killed)"
            where = (f"waited in tvm-ffi's build lock ({len(locks)} lock file{'s' if len(locks) != 1 else ''} "
                     "under ~/.cache/tvm-ffi, 0 compiles)" if locks and not builds else
                     f"were still running ({builds} compiles, {len(locks)} lock files)")
            cause = f"{hung} of {count} processes {where} {bound:.0f} s after importing tvm-ffi; killed"
        if failed:
            first = failed[0].replace(f"{path}/", "")
            evidence += f"; {first[:120]}"
            cause = cause or f"{len(failed)} of {count} processes failed; the first: {first[:120]}"
        outcomes.append(Outcome(bool(hung or failed), evidence, cause=cause))
    return outcomes[0], outcomes[1]

"""The scenarios ``sharedfs demo`` runs, in order, with the public threads they reproduce."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Mapping

from .broadcast import broadcast_trap
from .flock import datasets_enolck, datasets_enosys, node_local_flock
from .frameworks import (
    megatron_killed_rank0,
    modelscope_enolck,
    team_modules,
    torch_extension,
    torch_extension_enolck,
    torch_extension_enosys,
    torch_extension_two_nodes,
    tvm_ffi_enolck,
)
from .holders import live_lock, stale_lock
from .lag import makedirs_race, visibility_timeout
from .shards import triton_cache, webdataset_duplicates, wids_flockless
from .sim import OLD_FILELOCK, OnRealFS, Outcome, Sim

#: Public threads the scenarios cite, and where to read them.
REFERENCES = {
    "datasets#6395": "https://github.com/huggingface/datasets/issues/6395",
    "datasets#1672": "https://github.com/huggingface/datasets/issues/1672",
    "filelock#389": "https://github.com/tox-dev/filelock/issues/389",
    "lingua#49": "https://github.com/facebookresearch/lingua/issues/49",
    "OLMo#829": "https://github.com/allenai/OLMo/issues/829",
    "pytorch#92553": "https://github.com/pytorch/pytorch/issues/92553",
    "srt-slurm#251": "https://github.com/ishandhanani/srt-slurm/issues/251",
    "modelscope#1778": "https://github.com/modelscope/modelscope/issues/1778",
    "webdataset#386": "https://github.com/webdataset/webdataset/issues/386",
    "LlamaFactory#3065": "https://github.com/hiyouga/LLaMA-Factory/issues/3065",
    "ms-swift#3667": "https://github.com/modelscope/ms-swift/issues/3667",
    "pytorch#189245": "https://github.com/pytorch/pytorch/issues/189245",
    "triton#2688": "https://github.com/triton-lang/triton/issues/2688",
    "prime-rl PR #2305": "https://github.com/PrimeIntellect-ai/prime-rl/pull/2305",
    "diffusers#1517": "https://github.com/huggingface/diffusers/issues/1517",
    "tvm-ffi#667": "https://github.com/apache/tvm-ffi/issues/667",
}


@dataclass(frozen=True)
class Scenario:
    name: str
    field_report: str  # public threads (keys of REFERENCES) or the project's own docs
    run: Callable[[Sim], tuple[Outcome, Outcome]]
    needs_fuse: bool = False
    #: Modules the scenario's programs import (checked in this interpreter before it runs).
    needs: tuple[str, ...] = ()
    #: What the scenario shows, in one sentence (the HTML/Markdown report).
    story: str = ""
    #: The installed release of its framework fixed this failure itself ("torch 2.14"): without sharedfs it
    #: succeeds, and the demo says so instead of counting it as not fixed.
    upstream_fix: str = ""
    #: Per real filesystem: the volume this cross-node scenario runs on there, or why it does not run there
    #: (``{fs}`` is replaced by the filesystem's name); a kind missing here does not run there either.
    real: Mapping[str, OnRealFS | str] = field(default_factory=dict)

    def on(self, fs: str) -> OnRealFS | str:
        """How this scenario runs on the real filesystem ``fs``, or one line saying why it does not."""
        plan = self.real.get(fs, NOT_CROSS_NODE)
        return plan.format(fs=fs) if isinstance(plan, str) else plan


#: Why a scenario that does not claim a behaviour of one node's view of another does not run on a real one.
NOT_CROSS_NODE = "not a cross-node filesystem behaviour: it runs on this machine's own disk"
#: The lock failures no real filesystem here has: their flock works.
ENOSYS_ONLY = "its failure is a flock that answers ENOSYS (Lustre without -o flock); flock works on {fs}"
ENOLCK_ONLY = "its failure is a flock that answers ENOLCK (NFS without lockd); flock works on {fs}"
SAME_EVERYWHERE = "its failure is {what}, the same on every filesystem (it runs on this machine's own disk)"
FLOCK_ACROSS = "its failure is a flock that excludes one node only; {fs}'s flock excludes across client mounts"


def _on_every_real(plan: OnRealFS | str) -> dict[str, OnRealFS | str]:
    return dict.fromkeys(("juicefs", "moosefs", "glusterfs"), plan)


def _torch_scenarios() -> tuple[Scenario, ...]:
    """torch's build lock, as the installed torch and filelock fail (torch missing: the scenario it is skipped as).

    torch < 2.14 builds under a ``FileBaton`` that a killed builder leaves behind, on any filesystem.
    torch >= 2.14 holds filelock's lock instead: fixed upstream on a local disk, but NFS without
    lockd, Lustre without ``-o flock`` and GPFS-like node-local flock each fail it their own way.
    """
    from sharedfs.demo.scenario_torch import UPSTREAM_FIX, builds_under_filelock, filelock_on_enosys

    killed = Scenario("torch C++ extension build killed half-way", "pytorch#189245", torch_extension,
                      needs=("torch",), story="A cpp_extension.load() (how DeepSpeed builds its ops) is SIGKILLed "
                                              "mid-compile; the rerun must load the extension.",
                      real=_on_every_real(SAME_EVERYWHERE.format(what="the lock file a killed builder left")))
    if not builds_under_filelock():
        return (killed,)
    enosys = {
        "soft-fallback": "filelock >= 4.3 falls back to a soft lock (the file's existence); a load() is SIGKILLed "
                         "mid-compile, and the rerun must load the extension.",
        "swaps-class": "filelock 3.24-4.2 swaps the lock's class for SoftFileLock mid-acquire, which breaks "
                       "torch's FileLock subclass in __exit__.",
        "raises": "filelock before 3.24 raises where flock answers ENOSYS.",
    }[filelock_on_enosys()]
    return (
        replace(killed, upstream_fix=UPSTREAM_FIX,
                story=killed.story + f" {UPSTREAM_FIX} holds a flock instead of a baton, which the kernel drops "
                                     "with the killed builder."),
        Scenario("torch C++ extension build on NFS without lockd (ENOLCK)", "pytorch#189245", torch_extension_enolck,
                 needs=("torch",), story=f"{UPSTREAM_FIX}+ builds under filelock's flock, which NFS without lockd "
                                         "refuses with ENOLCK: every load() fails, the first build included.",
                 real=_on_every_real(ENOLCK_ONLY)),
        Scenario("torch C++ extension build on Lustre without -o flock (ENOSYS)", "pytorch#189245",
                 torch_extension_enosys, needs=("torch",),
                 story=f"{UPSTREAM_FIX}+ builds under filelock's flock, which this Lustre answers with ENOSYS: "
                       + enosys, real=_on_every_real(ENOSYS_ONLY)),
        Scenario("torch C++ extensions built by two nodes at once (GPFS, localflock)", "pytorch#189245",
                 torch_extension_two_nodes, True, needs=("torch",),
                 story=f"{UPSTREAM_FIX}+ builds under filelock's flock, which excludes processes of one node only: "
                       "node b loads the extension while node a builds it.",
                 real={"juicefs": FLOCK_ACROSS, "glusterfs": FLOCK_ACROSS,
                       "moosefs": "not wired to client mounts yet: its two builders share one path, and MooseFS "
                                  "with node-local locks has the behaviour (a gap, not a result)"}),
    )


SCENARIOS = (
    Scenario("datasets, Lustre without -o flock (ENOSYS)", "datasets#6395", datasets_enosys, needs=("datasets",),
             story=f"Hugging Face datasets with {OLD_FILELOCK} (cluster images often pin one before 3.24) on a "
                   "filesystem whose flock answers ENOSYS.", real=_on_every_real(ENOSYS_ONLY)),
    Scenario("datasets, NFS without lockd (ENOLCK)", "datasets#1672", datasets_enolck, needs=("datasets",),
             story="datasets on an NFS mount whose lock daemon is not running: every lock call answers ENOLCK.",
             real=_on_every_real(ENOLCK_ONLY)),
    Scenario("flock that excludes one node only (GPFS, localflock)", "filelock#389", node_local_flock, True,
             story="8 processes on 2 nodes increment one counter under filelock.FileLock; flock succeeds but "
                   "excludes only processes on the same node.",
             # Run on every real one, whatever its flock does: the cause printed is the one the run shows.
             real={"juicefs": OnRealFS(), "glusterfs": OnRealFS(),
                   "moosefs": OnRealFS(node_local_locks=True)}),
    Scenario("6 ranks makedirs on a lagging filesystem", "lingua#49, pytorch#92553", makedirs_race, True,
             needs=("torch",),
             story="6 ranks on 3 nodes run lingua's CheckpointManager and maybe_run_profiler (os.makedirs, "
                   "exist_ok=True) and torch DCP's save (Path.mkdir) unchanged while the metadata cache lags 3 s.",
             real=_on_every_real(OnRealFS())),
    Scenario("rank 0 made a dir, other node waits 10 s (OLMo-core)", "OLMo#829", visibility_timeout, True,
             story="4 ranks on 2 nodes save a checkpoint with OLMo-core 3.0.0's save_state_dict, unchanged, while "
                   "the other node's metadata cache hides the new directory for 13 s; OLMo-core waits a fixed 10 s.",
             real=_on_every_real("its failure needs a metadata cache that lags longer than OLMo-core's 10 s wait; "
                                 "{fs}'s lagging client caches lag 3 s")),
    Scenario("lock of a killed job on another node", "srt-slurm#251, modelscope#1778", stale_lock,
             story="A job on node A is killed while it holds an existence lock; the rerun on node B wants it.",
             real=_on_every_real(SAME_EVERYWHERE.format(what="an existence lock whose holder is on another host "
                                                             "(its own namespaces)"))),
    Scenario("a live lock is never broken", "docs/troubleshooting.md", live_lock,
             story=f"Two containers with one host name but separate PID namespaces (one pod; or nodes whose "
                   f"containers share a name), {OLD_FILELOCK}: A holds an existence lock and works on, B wants it "
                   "and must wait, never break it.",
             real=_on_every_real(SAME_EVERYWHERE.format(what="a holder's pid read in another PID namespace"))),
    Scenario("wids cache on storage without flock (ENOLCK)", "webdataset#386", wids_flockless,
             needs=("wids", "torch"),
             story="2 wids readers on 2 nodes share a cache directory on NFS without lockd.",
             real=_on_every_real(ENOLCK_ONLY)),
    Scenario("8 webdataset readers share one cache_dir", "webdataset#386", webdataset_duplicates,
             needs=("webdataset",),
             story="8 webdataset readers on 2 nodes share one cache_dir on network storage.",
             real=_on_every_real("webdataset takes no lock at all, so its duplicate downloads do not depend on "
                                 "the filesystem (the hostilefs run shows them)")),
    Scenario("Dataset from a node-local cache sent to another node", "LlamaFactory#3065, ms-swift#3667",
             broadcast_trap, needs=("datasets",),
             story="Node A prepares a dataset in its node-local cache and broadcasts it pickled to node B.",
             real=_on_every_real("its failure is node-local storage (a private tmpfs per node), not the shared "
                                 "filesystem")),
    Scenario("9 processes fill one Triton kernel cache", "triton#2688, prime-rl PR #2305", triton_cache, True,
             needs=("triton",),
             story="9 processes on 3 nodes put and read the same 6 kernels through triton.runtime.cache's own "
                   "get_cache_manager, as triton.compiler.compile does, while the metadata cache lags 2 s.",
             real=_on_every_real(OnRealFS())),
    *_torch_scenarios(),
    Scenario("two users of a team HF_HOME load remote code (transformers)", "diffusers#1517", team_modules,
             needs=("transformers",),
             story="Two real users of a lab's HF_HOME (2775, its group; umask 022) load remote-code models with "
                   "AutoConfig.from_pretrained(repo, trust_remote_code=True): alice acc/a, then bob acc/b.",
             real=_on_every_real(SAME_EVERYWHERE.format(what="a team directory's modes"))),
    Scenario("ModelScope download on NFS without lockd (ENOLCK)", "modelscope#1778", modelscope_enolck,
             needs=("modelscope_hub",),
             story="4 ModelScope users on 2 nodes download one file into a hub cache on NFS without lockd, through "
                   "modelscope_hub's own download_file and lock (the network fetch replaced locally).",
             real=_on_every_real(ENOLCK_ONLY)),
    Scenario("Megatron index after a killed rank 0", "docs/frameworks/megatron.md", megatron_killed_rank0,
             needs=("megatron",),
             story="Rank 0 of a megatron-core job (GPTDataset on CPU, gloo) is SIGKILLed while numpy.save writes "
                   "its shuffle index in path_to_cache; the rerun builds the datasets from that cache.",
             real=_on_every_real(SAME_EVERYWHERE.format(what="an index file a killed rank 0 left cut short"))),
    Scenario("tvm-ffi JIT build on NFS without lockd (ENOLCK)", "tvm-ffi#667", tvm_ffi_enolck, needs=("tvm_ffi",),
             story="4 processes on 2 nodes JIT-build one C++ function with tvm_ffi.cpp.load_inline, HOME on NFS "
                   "without lockd: tvm-ffi's build lock takes ENOLCK for \"held\" and retries every 0.1 s.",
             real=_on_every_real(ENOLCK_ONLY)),
)

"""The one table of caches sharedfs places through their own environment variables; a new cache is a new row.

A variable the user set is never touched.
"""

from __future__ import annotations

import os
from typing import Mapping

from sharedfs.model.structs import frozen


@frozen
class PlacedCache:
    """One row of :data:`PLACED_CACHES`."""

    #: Short name (the library's), used in logs, ``sharedfs status`` and the node-local directory's name.
    name: str
    #: The variable sharedfs sets; the library reads it for its cache directory.
    variable: str
    #: The library's default when the variable is unset, as the library spells it (``~`` and
    #: ``$VAR`` expanded by :func:`default_path`).
    default: str
    #: Whether one directory may be shared by the processes of several nodes.
    shareable: bool
    #: Why (the public report), in a few words.
    why: str
    #: When the library reads the variable: the export must come first.
    read: str
    #: Where the cache is below the variable's directory, when the variable names a base directory
    #: (FlashInfer's ``<base>/.cache/flashinfer``): the per-node directories go there, not into the base.
    cache_under: str = ""
    #: Whether the library creates the directory its variable names (torch creates its default's
    #: directories but not the one ``PYTORCH_KERNEL_CACHE_PATH`` names): if not, sharedfs makes it.
    made_by_library: bool = True


PLACED_CACHES: tuple[PlacedCache, ...] = (
    PlacedCache("triton", "TRITON_CACHE_DIR", "$TRITON_HOME/.triton/cache", False,
                "processes without sharedfs's cache manager (python -S, another environment) remove key "
                "directories and replace entries others hold (triton#11512, prime-rl PR #2305)",
                "at every FileCacheManager(); Inductor uses its own directory only while it is unset"),
    PlacedCache("deep_gemm", "DG_JIT_CACHE_DIR", "~/.deep_gemm", False,
                "CUDA_ERROR_FILE_NOT_FOUND loading a kernel another node is writing (DeepGEMM#301)",
                "at each JIT build"),
    PlacedCache("flashinfer", "FLASHINFER_WORKSPACE_BASE", "~", False,
                "CUDA error: invalid argument from a cold shared cache (flashinfer#4062); its cache is "
                "<base>/.cache/flashinfer",
                "at the import of flashinfer.jit.env", cache_under=".cache/flashinfer"),
    PlacedCache("tilelang", "TILELANG_CACHE_DIR", "~/.tilelang/cache", False,
                "a JIT kernel cache written by every rank", "at the import of tilelang.env"),
    PlacedCache("miopen", "MIOPEN_USER_DB_PATH", "~/.config/miopen", False,
                "an SQLite database: database disk image is malformed under Slurm (MIOpen#1878)",
                "when MIOpen opens its user database"),
    PlacedCache("hf_xet", "HF_XET_CACHE", "$HF_HOME/xet", False,
                "stalls on NFS; vllm PR #49837 moved it off an NFS HF_HOME",
                "at the import of huggingface_hub.constants"),
    PlacedCache("tvm_ffi", "TVM_FFI_CACHE_DIR", "~/.cache/tvm-ffi", False,
                "final link failed: Stale file handle, file too short: every rank builds into one directory "
                "(sglang#31347, tvm-ffi#667)",
                "at each tvm_ffi.cpp build (load_inline, build)"),
    PlacedCache("vllm", "VLLM_CACHE_ROOT", "${XDG_CACHE_HOME}/vllm", False,
                "corrupted compilation artifact, UnpicklingError from a compile cache every node writes "
                "(vllm#18851, vllm#31199)",
                "each time vllm.envs is asked for it (after vLLM's import)"),
    PlacedCache("deep_ep", "EP_JIT_CACHE_DIR", "~/.deep_ep", False,
                "EP_HOST_ASSERT(runtime != nullptr) loading a kernel another node is writing (DeepEP#683)",
                "when DeepEP's JIT compiler is first made"),
    PlacedCache("torch_kernels", "PYTORCH_KERNEL_CACHE_PATH", "${XDG_CACHE_HOME}/torch/kernels", False,
                "CUDA driver error: invalid argument from a kernel cache every node writes (pytorch#156010)",
                "at the first jiterator (NVRTC) kernel of a process", made_by_library=False),
)

#: The variables the defaults above name, with their own defaults.
_BASES = {"TRITON_HOME": "~", "HF_HOME": "${XDG_CACHE_HOME}/huggingface", "XDG_CACHE_HOME": "~/.cache"}


def default_path(row: PlacedCache, environ: Mapping[str, str] | None = None) -> str:
    """Where ``row``'s library puts its cache when ``row.variable`` is unset, as an absolute path."""
    env = os.environ if environ is None else environ
    text = row.default
    for _ in range(3):  # $HF_HOME -> ${XDG_CACHE_HOME}/huggingface -> ~/.cache/huggingface
        for name, fallback in _BASES.items():
            value = env.get(name) or fallback
            text = text.replace("${" + name + "}", value).replace("$" + name, value)
    return os.path.abspath(os.path.expanduser(text))


def cache_path(row: PlacedCache, environ: Mapping[str, str] | None = None) -> str:
    """The directory ``row``'s cache occupies by default (what is classified, and where per-node directories go)."""
    return os.path.join(default_path(row, environ), row.cache_under) if row.cache_under else default_path(row, environ)

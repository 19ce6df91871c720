"""tvm-ffi users JIT-build one tiny C++ function with ``tvm_ffi.cpp.load_inline``, then call it.

Everything is tvm-ffi's own: the cache directory (``TVM_FFI_CACHE_DIR``, else ``~/.cache/tvm-ffi``), its
``mkdir(parents=True, exist_ok=True)``, its build lock ``<cache>/<name>_<hash>/lock`` (stock, or sharedfs's),
ninja and the compiler (``$CXX``: :func:`run` points it at a wrapper that logs each compile).  Nothing of
sharedfs is called: with sharedfs installed the tvm_ffi shim applies at ``import tvm_ffi``.

``python -m sharedfs.demo.scenario_tvm_ffi [--name --times --timings --sync DIR]`` is one user:
``--times N`` loads it N times in a row (the warm path after the first); ``--timings`` adds each load's
seconds.  ``--sync DIR`` (a local directory): once imported, wait until every process of the run
(``SHAREDFS_TEST_COUNT``) is, so that all of them reach tvm-ffi's cache at the same moment.  Prints one
JSON line: ``{"ok", "error", "lock": <class of extension.FileLock>, "cache", "seconds"}``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Mapping, Sequence

SOURCE = "int add_one(int x) { return x + 1; }"

#: ``$CXX`` for :func:`run`: logs the directory of each compile (one line), then runs the real compiler.
CXX = """#!/bin/sh
case " $* " in *" -c "*) echo "$PWD" >> {log} ;; esac
exec c++ "$@"
"""


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", default="add_one")
    parser.add_argument("--times", type=int, default=1)
    parser.add_argument("--timings", action="store_true")
    parser.add_argument("--sync")
    args = parser.parse_args(argv)

    import tvm_ffi.cpp
    from tvm_ffi.cpp import extension

    if args.sync:
        Path(args.sync, os.environ["SHAREDFS_TEST_INDEX"]).touch()
        deadline = time.monotonic() + 300
        while len(os.listdir(args.sync)) < int(os.environ["SHAREDFS_TEST_COUNT"]) and time.monotonic() < deadline:
            time.sleep(0.02)

    lock = f"{extension.FileLock.__module__}.{extension.FileLock.__qualname__}"
    cache = os.environ.get("TVM_FFI_CACHE_DIR", str(Path("~/.cache/tvm-ffi").expanduser()))
    seconds = []
    try:
        for _ in range(args.times):
            began = time.perf_counter()
            module = tvm_ffi.cpp.load_inline(args.name, cpp_sources=SOURCE, functions=["add_one"])
            seconds.append(time.perf_counter() - began)
            assert module.add_one(41) == 42
    except Exception as exc:  # noqa: BLE001 - the caller counts failures by their text
        error = f"{type(exc).__name__}: {exc}"
        print(json.dumps({"ok": False, "error": error[-2000:], "lock": lock, "cache": cache}))
        sys.exit(1)
    print(json.dumps({"ok": True, "error": None, "lock": lock, "cache": cache,
                      "seconds": seconds if args.timings else None}))


def missing_tools() -> list[str]:
    """What tvm-ffi's build needs from PATH and this machine lacks (ninja, a C++ compiler)."""
    return [tool for tool in ("ninja", "c++") if shutil.which(tool) is None]


def run(home: Path, work: Path, nodes: Mapping[str, int], env: Mapping[str, str], *,
        hung_after: float | None = None, timeout: float = 240.0) -> tuple[list[dict], Counter[str]]:
    """One user per process of ``nodes`` with ``HOME=home``, released together once all imported tvm-ffi.

    Returns each one's JSON line and the compiles per build directory (``work`` keeps the compiler wrapper and
    the start gate).  A process still running ``hung_after`` s after that release (or ``timeout`` s after the
    start) is killed and reported as ``{"hung": True}``: the time it waited is tvm-ffi's, not its import's.
    """
    from sharedfs.demo.nodes import node_env

    log, cxx, gate = work / "compiles.log", work / "cxx", work / "gate"
    cxx.write_text(CXX.format(log=log))
    cxx.chmod(0o755)
    gate.mkdir()
    order = [node for node, count in nodes.items() for _ in range(count)]
    procs = []
    try:
        for index, node in enumerate(order):
            out = tempfile.TemporaryFile()
            procs.append((subprocess.Popen([sys.executable, "-m", __name__, "--sync", str(gate)], cwd="/",
                                           stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                           env=node_env(node, {**env, "HOME": str(home), "CXX": str(cxx)},
                                                        SHAREDFS_TEST_INDEX=index, SHAREDFS_TEST_COUNT=len(order))),
                          out))
        deadline = time.monotonic() + timeout
        while any(proc.poll() is None for proc, _ in procs) and time.monotonic() < deadline:
            if hung_after is not None and len(os.listdir(gate)) == len(order):
                deadline, hung_after = min(deadline, time.monotonic() + hung_after), None
            time.sleep(0.05)
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    reports = []
    for proc, out in procs:
        out.seek(0)
        text = out.read().decode("utf-8", "replace")
        out.close()
        lines = [line for line in text.splitlines() if line.startswith("{")]
        if lines:
            reports.append(json.loads(lines[-1]))
        else:
            tail = text.strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
            hung = proc.returncode == -9
            reports.append({"ok": False, "hung": hung, "error": None if hung else f"died: {tail[0]}", "lock": None})
    compiles = Counter(os.path.dirname(line) for line in log.read_text().splitlines()) if log.exists() else Counter()
    return reports, compiles


if __name__ == "__main__":
    main()

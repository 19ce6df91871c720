"""One tvm-ffi user: ``tvm_ffi.cpp.load_inline`` of one tiny C++ function, then a call of it.

Everything is tvm-ffi's own: the cache directory (``TVM_FFI_CACHE_DIR``, else ``~/.cache/tvm-ffi``), its
``mkdir(parents=True, exist_ok=True)``, its build lock ``<cache>/<name>_<hash>/lock`` (stock, or sharedfs's),
ninja and the compiler (``$CXX``: the test points it at a wrapper that logs each compile and link).

``--times N`` loads it N times in a row (the warm path after the first); ``--timings`` adds each load's
seconds.  ``--sync DIR`` (a local directory): once imported, wait until every process of the run
(``SHAREDFS_TEST_COUNT``) is, so that all of them reach tvm-ffi's cache at the same moment.  Prints one JSON line: ``{"ok", "error", "lock": <class of extension.FileLock>, "cache",
"seconds"}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

SOURCE = "int add_one(int x) { return x + 1; }"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", default="add_one")
    parser.add_argument("--times", type=int, default=1)
    parser.add_argument("--timings", action="store_true")
    parser.add_argument("--sync")
    args = parser.parse_args()

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
    except Exception as exc:  # noqa: BLE001 - the test counts failures by their text
        error = f"{type(exc).__name__}: {exc}"
        print(json.dumps({"ok": False, "error": error[-2000:], "lock": lock, "cache": cache}))
        sys.exit(1)
    print(json.dumps({"ok": True, "error": None, "lock": lock, "cache": cache,
                      "seconds": seconds if args.timings else None}))


if __name__ == "__main__":
    main()

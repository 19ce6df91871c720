"""Many processes on several simulated nodes fill and read one Triton kernel cache through Triton's own API.

Each process does what ``triton.compiler.compile`` does with the cache for a few kernels
(triton 3.x): ``get_cache_manager(key)``, ``get_group("<kernel>.json")``; on a miss it
"compiles" (fixed bytes stand in for the IR and the binary, no GPU) and ``put``s each file,
then ``put_group``s the metadata group; on a hit, or after its own put, it reads every file
of the group back, as ``CompiledKernel`` does.  Nothing of sharedfs is called: with sharedfs
installed the Triton shim applies at ``import triton``.

:func:`run` starts the processes on hostilefs (``lagging``: a node does not see another's new
entries for a while) and returns each process's errors; :func:`failed` counts the processes
that hit one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping, Sequence

from sharedfs.demo.nodes import run_on_nodes

#: The program of one process (argv: cache directory, kernels, rounds).
RANK = r"""
import hashlib, json, os, sys, time
cache_dir, kernels, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
# On a real filesystem each node reaches the cache through its own client mount.
cache_dir = json.loads(os.environ.get("SCENARIO_NODE_DIRS", "{}")).get(os.environ["SHAREDFS_NODE_ID"], cache_dir)
os.environ["TRITON_CACHE_DIR"] = cache_dir
from triton.runtime.cache import get_cache_manager
index, gate = int(os.environ["SHAREDFS_TEST_INDEX"]), os.environ["SCENARIO_GATE"]
# Start together (a local directory as the barrier): the concurrency must not depend on how fast each
# process imported triton on a loaded machine; then in slightly different steps, as ranks do.
open(os.path.join(gate, str(index)), "w").close()
deadline = time.monotonic() + 120
while len(os.listdir(gate)) < int(os.environ["SHAREDFS_TEST_COUNT"]) and time.monotonic() < deadline:
    time.sleep(0.005)
time.sleep(0.02 * (index % 4))

def files(i):
    body = hashlib.sha256(b"kernel %d" % i).digest() * 64
    return {f"k{i}.ttir": b"ttir " + body, f"k{i}.cubin": b"\x7fELF" + body,
            f"k{i}.json": json.dumps({"name": f"k{i}", "hash": body[:8].hex()}).encode()}

errors, hits, puts, kind = [], 0, 0, None
for r in range(rounds):
    for i in range(kernels):
        key = hashlib.sha256(b"kernel-key %d" % i).hexdigest()
        expected = files(i)
        try:
            manager = get_cache_manager(key)
            kind = f"{type(manager).__module__}.{type(manager).__qualname__}"
            group = manager.get_group(f"k{i}.json")
            if group is None:
                group = {}
                for name, data in expected.items():
                    group[name] = manager.put(data, name, binary=True)
                    puts += 1
                manager.put_group(f"k{i}.json", group)
            else:
                hits += 1
            for name, path in group.items():
                with open(path, "rb") as fh:
                    if fh.read() != expected[name]:
                        raise AssertionError(f"{path} does not hold what was put")
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
print(json.dumps({"errors": errors, "hits": hits, "puts": puts,
                  "manager": kind}))
"""


def run(cache_dir: Path, nodes: Mapping[str, int] | Sequence[str], env: Mapping[str, str], *, kernels: int = 6,
        rounds: int = 3, python: str | None = None, timeout: float = 240.0,
        node_dirs: Mapping[str, str] | None = None) -> list[dict]:
    """Run :data:`RANK` in each process of ``nodes``; one dict per process (``errors``, ``hits``, ``puts``, ...).

    ``node_dirs`` (a real filesystem): each node's path to the cache, through its own client mount.
    """
    import sys
    import tempfile

    argv = [python or sys.executable, "-c", RANK, str(cache_dir), str(kernels), str(rounds)]
    extra = {"SCENARIO_NODE_DIRS": json.dumps(dict(node_dirs))} if node_dirs else {}
    with tempfile.TemporaryDirectory(prefix="sharedfs-triton-gate-") as gate:
        results = run_on_nodes(argv, nodes, env={**env, **extra, "SCENARIO_GATE": gate}, timeout=timeout)
    out = []
    for result in results:
        lines = result.stdout.strip().splitlines()
        try:
            report = json.loads(lines[-1]) if lines else None
        except ValueError:
            report = None
        if report is None:  # the process died before reporting (an import error, a crash)
            tail = result.stderr.strip().splitlines()[-1:] or [f"exit {result.returncode}"]
            report = {"errors": [f"died: {tail[0]}"], "hits": 0, "puts": 0, "manager": None}
        report["node"] = result.node
        out.append(report)
    return out


def failed(reports: Sequence[dict]) -> int:
    """How many processes hit at least one error."""
    return sum(1 for report in reports if report["errors"])


def first_errors(reports: Sequence[dict]) -> list[str]:
    """The first error of each failed process (for the test's message and the report)."""
    return [f"{report['node']}: {report['errors'][0]}" for report in reports if report["errors"]]

"""The node-local-cache broadcast trap: a dataset prepared on one node's local disk, read on another."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from .sim import Outcome, Sim, _jsonl, _unshare, last_error

#: Each simulated node mounts its own tmpfs at the *same* path in its own mount namespace: a real
#: node-local /tmp (same path on every node, different content), which one machine cannot imitate
#: with plain directories.
PRIVATE_TMPFS = 'mount -t tmpfs -o mode=1777 sharedfs-node-local "$0" && exec "$@"'
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
PICKLE = """
    import json, pickle, sys
    import datasets
    datasets.disable_progress_bars()
    mode, data, blob = sys.argv[1:4]
    if mode == "send":  # node A: prepare, then what broadcast_object_list does to a Dataset
        ds = datasets.load_dataset("json", data_files=data, split="train")
        open(blob, "wb").write(pickle.dumps(ds))
        sys.exit()
    ds = pickle.loads(open(blob, "rb").read())  # node B
    print(len(ds))
"""


def _on_node(prefix: list[str], node: str, root: Path, env: dict[str, str],
             *args: str) -> subprocess.CompletedProcess[str]:
    """Run PICKLE on ``node``: its own mount namespace with a private tmpfs at ``root``."""
    argv = [*prefix, "sh", "-c", PRIVATE_TMPFS, str(root), sys.executable, "-c", textwrap.dedent(PICKLE), *args]
    try:
        return subprocess.run(argv, capture_output=True, text=True, cwd="/", timeout=90, check=False,
                              env={**env, "SHAREDFS_NODE_ID": node})
    except subprocess.TimeoutExpired as exc:
        return subprocess.CompletedProcess(argv, -9, "", f"hung: killed after {exc.timeout:.0f} s")


def broadcast_trap(sim: Sim) -> tuple[Outcome, Outcome]:
    """Node A prepares a Dataset in its node-local cache and sends it pickled; node B cannot open it."""
    prefix = _unshare("--mount", "--propagation", "private")
    data = _jsonl(sim)
    outcomes = []
    for label, extra in (("plain", {"SHAREDFS_DISABLE": "1"}), ("sharedfs", {"SHAREDFS_CACHE": "node-local"})):
        root = sim.work / f"node-local-{label}"
        root.mkdir()
        blob = sim.work / f"dataset-{label}.pickle"
        env = {**sim.base_env, **OFFLINE, **extra, "SHAREDFS_CACHE_ROOT": str(root), "HF_HOME": str(root / "hf_home")}
        if label == "plain":  # the user's own node-local cache, as the usual advice for Lustre goes
            env["HF_DATASETS_CACHE"] = str(root / "hf_datasets")
        sent = _on_node(prefix, "a", root, env, "send", data, str(blob))
        if sent.returncode:
            raise RuntimeError(f"node a could not prepare the dataset: {last_error(sent)}")
        got = _on_node(prefix, "b", root, env, "receive", data, str(blob))
        if got.returncode == 0:
            outcomes.append(Outcome(False, f"node b opened its own copy: {got.stdout.strip()} rows"))
            continue
        error = last_error(got)
        full = next((line for line in reversed(got.stderr.splitlines()) if "NodeLocalDatasetError:" in line), "")
        explained = all(needed in full for needed in (
            "does not exist on this node (b)", "pickles its Arrow data as a file path", "SHAREDFS_CACHE=shared",
            "main_process_first(per_node=True)"))
        if explained:
            # Still an error, but the explanatory one (cause and both fixes) instead of a bare missing
            # path: counted as fixed, and the evidence says so.
            outcomes.append(Outcome(False, "explanatory error (counted as fixed): NodeLocalDatasetError: node b "
                                           "cannot open node a's node-local Arrow file; names the cause (pickled "
                                           "as a path) and both fixes (shared cache, one preparer per node)"))
        else:
            outcomes.append(Outcome(True, f"node b: {error}"))
    return outcomes[0], outcomes[1]

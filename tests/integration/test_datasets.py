"""User stories of the datasets shim: real ``datasets``, real processes, real filesystem faults.

Every story first shows the failure without sharedfs (``SHAREDFS_DISABLE=1``, or a venv
before ``pip install sharedfs``) and then its absence with it.  Simulated nodes are
processes with different ``SHAREDFS_NODE_ID`` (and ``SHAREDFS_CACHE_ROOT`` standing in for
each node's local disk); hostilefs decides what each node's locks exclude.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from harness.skips import skip_or_fail
from helpers import Venv, clean_env, make_venv
from helpers.perrun import built_once_per_run
from packaging.version import Version

from sharedfs.demo.nodes import NodeResult, assert_all_ok, node_env, run_on_nodes
from sharedfs.demo.ports import free_port

pytestmark = pytest.mark.slow

#: The old stack of the matrix: what a 2025 cluster image has (datasets 3.x pulls the hub 0.x
#: line that transformers 4.48 also accepts).  The new stack is the dev environment itself.
OLD_STACK = ("datasets==3.6.0", "huggingface_hub==0.36.0")
#: The last filelock without the ENOSYS -> SoftFileLock fallback (filelock PR #480 is 3.24.0).
OLD_FILELOCK = "filelock==3.23.0"
ROWS = 300
#: Offline: the hub is unreachable here, and a stray request must fail fast, not hang.
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
PREPARING = "Downloading and preparing dataset"
SEED000 = "FileSystem does not appear to support flock"

# One process of a story: optionally wait at a start gate (so that every process reaches
# load_dataset at the same moment), load a JSON dataset, map it with a function that records
# which process computed it, and print a digest of what it got.
WORKER = r"""
import hashlib, json, os, sys, time
import datasets
datasets.logging.set_verbosity_info()  # "Downloading and preparing dataset" = one preparation
data, cache, counter, gate = sys.argv[1:5]
if gate != "-":
    os.makedirs(gate, exist_ok=True)
    open(os.path.join(gate, os.environ.get("SHAREDFS_TEST_INDEX", str(os.getpid()))), "w").close()
    deadline = time.time() + 120
    while len(os.listdir(gate)) < int(os.environ["SHAREDFS_TEST_COUNT"]) and time.time() < deadline:
        time.sleep(0.005)

def double(batch):
    with open(counter, "a") as fh:
        fh.write(f"{os.getpid()}\n")
    time.sleep(float(os.environ.get("T_MAP_SECONDS", "0")))  # a real map (tokenising) takes a while
    return {"y": [x * 2 for x in batch["x"]]}

kwargs = {} if cache == "-" else {"cache_dir": cache}
ds = datasets.load_dataset("json", data_files=data, split="train", **kwargs)
ds = ds.map(double, batched=True, batch_size=100000)
table = ds.to_dict()
print(json.dumps({"digest": hashlib.sha256(json.dumps(table, sort_keys=True).encode()).hexdigest(),
                  "rows": len(ds), "files": [f["filename"] for f in ds.cache_files]}))
"""


def write_jsonl(path: Path, rows: int = ROWS) -> Path:
    path.write_text("".join(json.dumps({"x": i, "text": f"row {i}"}) + "\n" for i in range(rows)))
    return path


def expected_digest(rows: int = ROWS) -> str:
    table = {"x": list(range(rows)), "text": [f"row {i}" for i in range(rows)], "y": [2 * i for i in range(rows)]}
    return hashlib.sha256(json.dumps(table, sort_keys=True).encode()).hexdigest()


def run_worker(python: str, data: Path, cache: Path | str, counter: Path, env: dict[str, str],
               timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([python, "-c", WORKER, str(data), str(cache), str(counter), "-"],
                          env=clean_env({**OFFLINE, **env}), capture_output=True, text=True, timeout=timeout, cwd="/")


def outcome(proc: subprocess.CompletedProcess[str] | NodeResult) -> dict[str, Any]:
    """The worker's JSON line, or the last line of its traceback."""
    if proc.returncode == 0:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    return {"error": lines[-1] if lines else f"exit {proc.returncode}"}


def raises_on_enolck(python: str) -> bool:
    """filelock >= 3.20 raises "No locks available"; older releases take ENOLCK for contention and wait forever."""
    proc = subprocess.run([python, "-c", "import filelock; print(filelock.__version__)"], capture_output=True,
                          text=True, env=clean_env({"SHAREDFS_DISABLE": "1"}), check=True)
    return Version(proc.stdout.strip()) >= Version("3.20")


def map_runs(counter: Path) -> Counter[str]:
    return Counter(counter.read_text().split()) if counter.exists() else Counter()


@pytest.fixture(scope="session")
def old_stack_venv(tmp_path_factory: pytest.TempPathFactory, sharedfs_wheel: Path) -> Venv:
    """datasets 3.6 + huggingface_hub 0.36 with sharedfs and the filelock its requirement gives (built once per
    run; its tests only run in it)."""
    path = built_once_per_run(tmp_path_factory, "old-stack-venv",
                              lambda path: make_venv(path, str(sharedfs_wheel), *OLD_STACK))
    return Venv(path)


# -- datasets#6395: Lustre without -o flock ------------------------------------------------------


def test_lustre_noflock_old_filelock_is_fixed_by_pip_install_sharedfs(
    tmp_path: Path, hostile_mount, sharedfs_wheel: Path
) -> None:
    """The first field report: Lustre without ``-o flock`` + filelock < 3.24 -> NotImplementedError.

    The user does one thing: ``pip install sharedfs`` into the same venv.
    """
    venv = make_venv(tmp_path / "old-filelock", OLD_FILELOCK, "datasets==5.2.0")
    lustre = hostile_mount("lustre-noflock")
    data = write_jsonl(tmp_path / "data.jsonl")

    before = run_worker(venv.python, data, lustre.path / "cache", tmp_path / "map-before", {})
    assert before.returncode != 0
    assert f"NotImplementedError: {SEED000}; use SoftFileLock instead" in before.stderr

    venv.pip("install", str(sharedfs_wheel))
    after = run_worker(venv.python, data, lustre.path / "cache", tmp_path / "map-after", {"SHAREDFS_LOG": "info"})
    assert after.returncode == 0, after.stderr
    assert outcome(after)["digest"] == expected_digest()
    assert "datasets locks -> soft: existence lock on fuse" in after.stderr  # one line says what changed


# -- NFS without lockd, old and new stacks -------------------------------------------------------


@pytest.mark.parametrize("stack", ["new", "old"])
def test_nfs_nolock_enolck_fails_without_sharedfs_and_works_with_it(
    stack: str, tmp_path: Path, hostile_mount, request: pytest.FixtureRequest
) -> None:
    """ENOLCK (datasets#1672) fails on every filelock release, the newest included."""
    python = sys.executable if stack == "new" else request.getfixturevalue("old_stack_venv").python
    nfs = hostile_mount("nfs-nolock")
    data = write_jsonl(tmp_path / "data.jsonl")

    if raises_on_enolck(python):
        without = run_worker(python, data, nfs.path / "cache", tmp_path / "map-without", {"SHAREDFS_DISABLE": "1"})
        assert without.returncode != 0
        assert "OSError: [Errno 37] No locks available" in without.stderr
    else:  # filelock < 3.20 (the last on Python 3.9 is 3.19): load_dataset hangs, which is worse
        with pytest.raises(subprocess.TimeoutExpired):
            run_worker(python, data, nfs.path / "cache", tmp_path / "map-without", {"SHAREDFS_DISABLE": "1"},
                       timeout=10)

    with_ = run_worker(python, data, nfs.path / "cache", tmp_path / "map-with", {})
    assert with_.returncode == 0, with_.stderr
    assert outcome(with_)["digest"] == expected_digest()


# -- NFS answering ENOLCK/ESTALE to a release -------------------------------------------------------


@pytest.mark.parametrize("answer", ["ENOLCK", "ESTALE"])
def test_an_unlock_nfs_cannot_confirm_fails_stock_datasets_and_never_reaches_it_with_sharedfs(
    answer: str, tmp_path: Path
) -> None:
    """NFS answers ENOLCK (lockd overwhelmed by many ranks starting at once) or ESTALE to an *unlock*: filelock
    raises it out of ``release()``, so ``load_dataset`` fails after its work is done.  With sharedfs the
    release completes (the descriptor's close lets go of the lock in any case) and says so once."""
    from sharedfs.demo.preload import preload_env

    cache = tmp_path / "cache"
    cache.mkdir()
    data = write_jsonl(tmp_path / "data.jsonl")
    faults = preload_env([cache], answer, base={}, only_unlock=True)
    without = run_worker(sys.executable, data, cache / "stock", tmp_path / "map-without",
                         {**faults, "SHAREDFS_DISABLE": "1"})
    assert without.returncode != 0
    assert f"[Errno {getattr(errno, answer)}]" in without.stderr, without.stderr[-2000:]
    with_ = run_worker(sys.executable, data, cache / "sharedfs", tmp_path / "map-with", faults)
    assert with_.returncode == 0, with_.stderr[-3000:]
    assert outcome(with_)["digest"] == expected_digest()
    said = [line for line in with_.stderr.splitlines() if f"answered {answer}" in line]
    assert len(said) == 1 and "treated as released" in said[0], with_.stderr[-3000:]


# -- 8 processes, 2 nodes, one shared cache ------------------------------------------------------


def _eight_on_localflock(tmp_path: Path, mnt: Path, label: str, env: dict[str, str]) -> tuple[list[NodeResult], int, Counter[str]]:
    data = write_jsonl(tmp_path / "data.jsonl", 3000)
    counter = tmp_path / f"map-{label}"
    argv = [sys.executable, "-c", WORKER, str(data), str(mnt / f"cache-{label}"), str(counter),
            str(tmp_path / f"gate-{label}")]
    # The map takes 2 s, as a real one does: without a lock around map, every process that reaches
    # it inside those 2 s computes it again.  (With an instant map the race was lost now and then on
    # a loaded machine: one process had written the map's cache before the others looked.)
    env = {**OFFLINE, "T_MAP_SECONDS": "2", **env}
    results = run_on_nodes(argv, {"a": 4, "b": 4}, env=clean_env(env), timeout=240, cwd="/")
    preparations = sum(r.stderr.count(PREPARING) for r in results)
    return results, preparations, map_runs(counter)


def test_eight_processes_on_two_nodes_prepare_once_on_localflock(tmp_path: Path, hostile_mount) -> None:
    """GPFS / Lustre ``localflock``: flock succeeds but excludes one node only.

    Without sharedfs each node's first process prepares (two writers in one
    ``.incomplete`` directory) and every process runs the map itself: datasets has no lock
    around ``map`` at all.  A typical run here (a map of 2 s): 2 preparations, the map computed by
    7 of 8 processes, 1 or 2 processes dead of FileNotFoundError on a half-written ``.incomplete`` or map
    cache file.  With sharedfs: one preparation, one map, identical data, no failure.
    """
    mnt = hostile_mount("localflock").path
    results, preparations, maps = _eight_on_localflock(tmp_path, mnt, "without", {"SHAREDFS_DISABLE": "1"})
    failed = [outcome(r)["error"] for r in results if r.returncode != 0]
    assert preparations > 1 or len(maps) > 1 or failed, (preparations, maps, failed)

    results, preparations, maps = _eight_on_localflock(tmp_path, mnt, "with", {})
    assert_all_ok(results)
    assert preparations == 1, [r.stderr for r in results]
    assert len(maps) == 1, maps  # one process computed the map; seven loaded its result
    got = [outcome(r) for r in results]
    assert {g["digest"] for g in got} == {expected_digest(3000)} and {g["rows"] for g in got} == {3000}
    # Nothing half-written was left or shown: no datasets temp dir, no stray map temp file.
    leftovers = [p for p in (mnt / "cache-with").rglob("*") if p.name.endswith(".incomplete") or p.name.startswith("tmp")]
    assert leftovers == []


# -- a holder killed mid-preparation -------------------------------------------------------------


# The preparation is a datasets generator builder whose generator can stall half-way: the
# victim provably holds the builder lock when it is killed.  T_STALL is not part of the
# generator's hash, so both runs prepare the same cache entry.
STALLING_WORKER = r"""
import os, sys, time
import datasets
cache, started = sys.argv[1], sys.argv[2]

def rows():
    for i in range(1000):
        if i == 500 and os.environ.get("T_STALL"):
            open(started, "w").close()
            time.sleep(600)
        yield {"x": i}

ds = datasets.Dataset.from_generator(rows, cache_dir=cache)
print(len(ds), sum(ds["x"]))
"""


def test_preparer_killed_mid_preparation_next_run_completes(tmp_path: Path, hostile_mount) -> None:
    """SIGKILL (OOM killer, Slurm preemption) while holding the builder lock on a soft-lock filesystem.

    Without sharedfs there is nothing to compare on this filesystem: datasets cannot take
    a lock at all there (datasets#6395 above).  filelock >= 3.24 breaks a dead holder's soft lock
    by itself on the same host, older releases never do (test_huggingface_hub shows that
    hang); sharedfs's holder record makes it work on the same *node*.  A holder on another
    node is waited for and named, never guessed dead (the primitives' rules; the Slurm plugin
    can prove a job gone).
    """
    cache = hostile_mount("lustre-noflock").path / "cache"
    started = tmp_path / "started"
    argv = [sys.executable, "-c", STALLING_WORKER, str(cache), str(started)]
    victim = subprocess.Popen(argv, env=clean_env({**OFFLINE, "SHAREDFS_NODE_ID": "a", "T_STALL": "1"}),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd="/")
    try:
        deadline = time.monotonic() + 120
        while not started.exists():
            assert victim.poll() is None, victim.stderr.read() if victim.stderr else ""
            assert time.monotonic() < deadline, "preparation never started"
            time.sleep(0.02)
        holders = list(cache.rglob("*_builder.lock.held"))  # the marker holds the holder's record
        assert holders and json.loads(holders[0].read_text())["pid"] == victim.pid
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait()
    assert list(cache.rglob("*_builder.lock.held"))  # the killed holder's marker is still there

    after = subprocess.run(argv, env=clean_env({**OFFLINE, "SHAREDFS_NODE_ID": "a", "SHAREDFS_LOG": "info"}),
                           capture_output=True, text=True, timeout=120, cwd="/")
    assert after.returncode == 0, after.stderr
    assert after.stdout.split() == ["1000", str(sum(range(1000)))]
    assert f"pid {victim.pid} on node a" in after.stderr and "is gone" in after.stderr  # said once, why


# -- node-local caches ----------------------------------------------------------------------------


def test_node_local_cache_each_node_prepares_once_into_its_own_dir(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "data.jsonl")
    counter = tmp_path / "maps"
    argv = [sys.executable, "-c", WORKER, str(data), "-", str(counter), str(tmp_path / "gate")]
    env = clean_env({**OFFLINE, "SHAREDFS_CACHE": "node-local", "HF_HOME": str(tmp_path / "hf_home")})
    results = run_on_nodes(argv, {"a": 2, "b": 2}, env=env, timeout=240, cwd="/", local_root=tmp_path / "local")
    assert_all_ok(results)
    by_node: dict[str, set[str]] = {}
    for r in results:
        got = outcome(r)
        assert got["digest"] == expected_digest()
        root = tmp_path / "local" / r.node
        assert all(Path(f).is_relative_to(root) for f in got["files"]), got["files"]  # its own node's disk
        by_node.setdefault(r.node, set()).update(got["files"])
    assert sum(r.stderr.count(PREPARING) for r in results) == 2  # once per node
    assert len(map_runs(counter)) == 2
    assert not (tmp_path / "hf_home" / "datasets").exists()  # nothing went to the shared default


# One rank per simulated node in a real gloo job.  Rank 0 sends two datasets to rank 1 with
# broadcast_object_list, as XTuner's process_hf_dataset does: one that only node a prepared,
# and one that every node prepared for itself (one preparer per node).
TRAP_WORKER = r"""
import json, os, sys
import datasets
import torch.distributed as dist
only_a, every_node = sys.argv[1], sys.argv[2]
rank = int(os.environ["RANK"])
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + os.environ["T_PORT"], rank=rank, world_size=2)
load = lambda path: datasets.load_dataset("json", data_files=path, split="train")

def receive(objects):
    try:
        dist.broadcast_object_list(objects, src=0)
    except Exception as exc:  # unpickling happens after the collective: the group stays usable
        return {"ok": False, "type": type(exc).__name__, "mro": [c.__name__ for c in type(exc).__mro__],
                "message": str(exc)}
    got = objects[0]
    return {"ok": True, "rows": len(got), "first": got[0], "files": [f["filename"] for f in got.cache_files]}

out = {"only_a": receive([load(only_a) if rank == 0 else None]), "every_node": receive([load(every_node)])}
print(json.dumps(out), flush=True)
dist.barrier()  # a clean exit on both ranks (gloo aborts a process whose peer vanished)
dist.destroy_process_group()
"""


#: Each simulated node gets its own tmpfs at the *same* path, in its own mount namespace: a
#: real node-local /tmp (same path string on every node, different content), which plain
#: directories on one machine cannot imitate (every "node" could open every other's files).
PRIVATE_TMPFS = 'mount -t tmpfs -o mode=1777 sharedfs-node-local "$0" && exec "$@"'


def _gloo_job(tmp_path: Path, env: dict[str, str], label: str) -> dict[str, Any]:
    """Run the 2-rank job (rank 0 on node a, rank 1 on node b); returns rank 1's report."""
    try:
        import torch.distributed  # noqa: F401
    except ImportError:
        skip_or_fail("the gloo job needs torch: pip install torch==2.13.0 numpy (scripts/requirements-test.txt)")
    if os.geteuid() != 0 or not shutil.which("unshare"):
        skip_or_fail("node-local disks are simulated with unshare --mount + tmpfs, which needs root")
    root = tmp_path / label / "node-local"
    root.mkdir(parents=True)
    port = str(free_port())
    procs = []
    for rank, node in enumerate(("a", "b")):
        penv = node_env(node, clean_env({**OFFLINE, **env, "T_PORT": port, "RANK": str(rank), "WORLD_SIZE": "2",
                                         "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "SHAREDFS_CACHE_ROOT": str(root),
                                         "HF_HOME": str(root / "hf_home")}))
        if "HF_DATASETS_CACHE" in env:  # the user's own node-local cache, the usual advice (datasets#6395)
            penv["HF_DATASETS_CACHE"] = str(root / "hf_datasets")
        argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", PRIVATE_TMPFS, str(root),
                sys.executable, "-c", TRAP_WORKER, str(tmp_path / "only_a.jsonl"), str(tmp_path / "every_node.jsonl")]
        procs.append(subprocess.Popen(argv, env=penv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/"))
    outs = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=180)
        assert proc.returncode == 0, stderr
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    assert outs[0]["only_a"]["ok"] and outs[0]["every_node"]["ok"], outs[0]
    assert not any(root.iterdir()), "a node wrote through to the shared directory under its tmpfs"
    return outs[1]


def test_dataset_sent_to_another_node_from_a_node_local_cache(tmp_path: Path) -> None:
    """The multi-node pickle trap (LlamaFactory#3065, ms-swift#3667) in a real 2-node gloo job."""
    write_jsonl(tmp_path / "only_a.jsonl")
    write_jsonl(tmp_path / "every_node.jsonl", 50)

    # Without sharedfs, the user's node-local HF_DATASETS_CACHE: a bare FileNotFoundError on rank 1.
    naive = _gloo_job(tmp_path, {"SHAREDFS_DISABLE": "1", "HF_DATASETS_CACHE": "node-local"}, "naive")["only_a"]
    assert not naive["ok"] and naive["type"] == "FileNotFoundError"
    assert str(tmp_path / "naive" / "node-local" / "hf_datasets") in naive["message"]

    # With sharedfs: the error says why and what to do; one preparer per node works.
    got = _gloo_job(tmp_path, {"SHAREDFS_CACHE": "node-local"}, "sharedfs")
    trap = got["only_a"]
    assert not trap["ok"] and trap["type"] == "NodeLocalDatasetError", trap
    assert {"FileNotFoundError", "SharedFSError"} <= set(trap["mro"])  # old handlers still catch it
    for needed in ("memory-mapped on node a", "does not exist on this node (b)", "pickles its Arrow data as a file path",
                   "broadcast_object_list", "SHAREDFS_CACHE=shared", "main_process_first(per_node=True)"):
        assert needed in trap["message"], (needed, trap["message"])
    works = got["every_node"]
    assert works["ok"], works
    assert works["rows"] == 50 and works["first"] == {"x": 0, "text": "row 0"}
    # The same path on node b, opened from node b's own tmpfs.
    assert all(f.startswith(str(tmp_path / "sharedfs" / "node-local")) for f in works["files"]), works["files"]


PICKLE_WORKER = r"""
import json, pickle, sys
import datasets
mode, data, blob = sys.argv[1:4]
if mode in ("send", "prepare-and-receive"):
    ds = datasets.load_dataset("json", data_files=data, split="train")
if mode == "send":
    open(blob, "wb").write(pickle.dumps(ds))
    sys.exit()
try:
    got = pickle.loads(open(blob, "rb").read())
    print(json.dumps({"ok": True, "rows": len(got), "files": [f["filename"] for f in got.cache_files]}))
except Exception as exc:
    print(json.dumps({"ok": False, "type": type(exc).__name__, "message": str(exc)}))
"""


def test_pickled_dataset_reopens_the_receiving_nodes_copy_under_its_own_root(tmp_path: Path) -> None:
    """Nodes whose node-local roots differ ($TMPDIR per job and node): the path is translated.

    Each node's root is its own tmpfs in its own mount namespace, so no node sees another's files.
    """
    data = write_jsonl(tmp_path / "data.jsonl")
    blob = tmp_path / "dataset.pickle"
    env = clean_env({**OFFLINE, "SHAREDFS_CACHE": "node-local", "HF_HOME": str(tmp_path / "hf_home")})

    if os.geteuid() != 0 or not shutil.which("unshare"):
        skip_or_fail("node-local disks are simulated with unshare --mount + tmpfs, which needs root")

    def on(node: str, mode: str) -> dict[str, Any]:
        penv = node_env(node, env, local_root=tmp_path / "local")  # a different root per node
        argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", PRIVATE_TMPFS, penv["SHAREDFS_CACHE_ROOT"],
                sys.executable, "-c", PICKLE_WORKER, mode, str(data), str(blob)]
        proc = subprocess.run(argv, capture_output=True, text=True, cwd="/", env=penv)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout) if proc.stdout.strip() else {}

    on("a", "send")
    prepared = on("b", "prepare-and-receive")
    assert prepared["ok"] and prepared["rows"] == ROWS
    assert all(Path(f).is_relative_to(tmp_path / "local" / "b") for f in prepared["files"]), prepared
    unprepared = on("c", "receive")
    assert not unprepared["ok"] and unprepared["type"] == "NodeLocalDatasetError"
    assert f"node a's node-local storage ({tmp_path / 'local' / 'a'})" in unprepared["message"]


# -- SHAREDFS_DISABLE=datasets ----------------------------------------------------------------------

FINGERPRINT = r"""
import hashlib, json, sys
if "--clean" in sys.argv:  # no .pth processed (-S): sharedfs is not even on sys.path's radar
    sys.path.append(sys.argv[-1])
import datasets, datasets.config as c, datasets.table as t
if "--unpatch" in sys.argv:  # patched on import, then every patch undone
    import sharedfs
    sharedfs.disable()
from datasets.arrow_dataset import Dataset
def code(obj):
    obj = getattr(obj, "__func__", obj)
    fn = getattr(obj, "__code__", None)
    return [getattr(obj, "__module__", None), getattr(obj, "__qualname__", None),
            hashlib.sha256(fn.co_code).hexdigest() if fn else None]
sites = ["datasets.utils._filelock", "datasets.builder", "datasets.utils.file_utils", "datasets.utils.extract"]
out = {s: code(getattr(sys.modules[s], "FileLock")) + [getattr(sys.modules[s], "FileLock").__init__.__module__] for s in sites}
out["map"] = code(Dataset.map)
out["getstate"] = code(t.MemoryMappedTable.__getstate__)
out["setstate"] = code(t.MemoryMappedTable.__setstate__)
out["config"] = {k: str(getattr(c, k)) for k in ("HF_DATASETS_CACHE", "DOWNLOADED_DATASETS_PATH", "EXTRACTED_DATASETS_PATH")}
out["sharedfs_shims"] = sorted(m for m in sys.modules if m.startswith("sharedfs.shims.datasets") and "--unpatch" not in sys.argv)
print(json.dumps(out, sort_keys=True))
"""


def test_disable_datasets_leaves_datasets_untouched(tmp_path: Path) -> None:
    """``SHAREDFS_DISABLE=datasets`` = a clean import; and every patch of the shim is reversible."""
    import sysconfig

    purelib = sysconfig.get_paths()["purelib"]
    env = clean_env({"SHAREDFS_CACHE": "node-local", "SHAREDFS_CACHE_ROOT": str(tmp_path), "HF_HOME": str(tmp_path / "h")})

    def fingerprint(*flags: str, extra: dict[str, str] | None = None, unpatch: bool = False) -> dict[str, Any]:
        args = ["--unpatch"] if unpatch else ["--clean", purelib] if "-S" in flags else []
        proc = subprocess.run([sys.executable, *flags, "-c", FINGERPRINT, *args],
                              env={**env, **(extra or {})}, capture_output=True, text=True, cwd="/")
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    clean = fingerprint("-S")  # a clean import: no .pth file ran, sharedfs is not loaded at all
    disabled = fingerprint(extra={"SHAREDFS_DISABLE": "datasets"})
    patched = fingerprint()
    assert disabled == clean
    # ... and the comparison can see a difference: the enabled shim changes these.
    assert patched["map"] != clean["map"] and patched["getstate"] != clean["getstate"]
    assert patched["datasets.builder"] != clean["datasets.builder"] and patched["config"] != clean["config"]
    assert patched["sharedfs_shims"] == ["sharedfs.shims.datasets"]
    assert fingerprint(unpatch=True) == clean  # sharedfs.disable() restores every attribute


def test_old_stack_gets_both_shims(old_stack_venv: Venv) -> None:
    """datasets 3.6 / huggingface_hub 0.36: both shims apply (status reads installed metadata)."""
    shims = {s["name"]: s for s in old_stack_venv.status()["shims"]}
    # The hub's shim applies on its first lock (a stand-in until then): take one.
    code = textwrap.dedent("""
        import json, os, tempfile, datasets, datasets.builder as b, huggingface_hub.file_download as fd
        import huggingface_hub.utils._fixes as f, sharedfs.startup.activation as a
        f.FileLock(os.path.join(tempfile.mkdtemp(), "a.lock"))
        print(json.dumps({k: [v.installed_version, v.supported, v.error, v.shim.applied]
                          for k, v in a.shim_states().items()}))
    """)
    states = json.loads(old_stack_venv.run(code).stdout)
    assert states["datasets"] == ["3.6.0", True, None, True]
    assert states["huggingface_hub"] == ["0.36.0", True, None, True]
    assert set(shims) >= {"datasets", "huggingface_hub"}

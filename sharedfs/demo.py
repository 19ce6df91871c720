"""``sharedfs demo``: reproduce the field failures on this machine, then run them again with sharedfs.

Each scenario runs real programs in separate processes on a simulated cluster
filesystem: a FUSE filesystem when this process may mount one (root and
/dev/fuse), otherwise an ``LD_PRELOAD`` library that makes flock fail; the
scenarios that need a second node's view of the filesystem (lag, node-local
locks) run only under FUSE, and the table says so.  The wids and webdataset
scenarios read real tar shards from a local HTTP server
(:mod:`sharedfs.testing.shardserver`, which counts the fetches); the broadcast
trap gives each simulated node its own tmpfs at the same path (``unshare``).
Everything mounted or started is cleaned up, also on Ctrl-C.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from .testing.shardserver import ShardServer

OLD_FILELOCK = "filelock==3.23.0"  # the last release that raises on ENOSYS (seed 000)


@dataclass
class Outcome:
    failed: bool  # did the program fail (crash, hang, corrupt)?
    evidence: str


@dataclass
class Result:
    name: str
    field_report: str
    without: Outcome | None = None
    with_sharedfs: Outcome | None = None
    skipped: str | None = None
    seconds: float = 0.0

    @property
    def fixed(self) -> bool:
        return bool(self.without and self.with_sharedfs and self.without.failed and not self.with_sharedfs.failed)


@dataclass
class Sim:
    """The simulated cluster filesystem: FUSE mounts, or the LD_PRELOAD fallback."""

    work: Path
    stack: ExitStack
    fuse: bool
    why_not_fuse: str = ""
    counter: int = 0
    base_env: dict[str, str] = field(default_factory=dict)

    def shared_dir(self, profile: str, **kwargs: int) -> tuple[Path, dict[str, str]]:
        """A fresh directory with ``profile``'s faults, and the environment its processes need."""
        self.counter += 1
        if self.fuse:
            from .testing.hostilefs import mount

            root = self.work / f"fs{self.counter}"
            (root / "backing").mkdir(parents=True)
            (root / "mnt").mkdir()
            handle = self.stack.enter_context(mount(root / "backing", root / "mnt", profile, **kwargs))
            return Path(handle.path), dict(self.base_env)
        from .testing.preload import preload_env

        path = self.work / f"fs{self.counter}"
        path.mkdir()
        errno_name = {"lustre-noflock": "ENOSYS", "nfs-nolock": "ENOLCK"}[profile]
        return path, preload_env([str(path)], errno_name, base=self.base_env)


def run_py(code: str, *args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                              env=env, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        return subprocess.CompletedProcess(exc.cmd, -9, exc.stdout or "", f"hung: killed after {timeout:.0f} s")


def last_error(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "error" in line or "hung" in line]
    return (errors or lines or ["(no output)"])[-1].strip()[:160]


# -- scenarios ----------------------------------------------------------------------------------

LOAD = """
    import json, sys
    import datasets
    datasets.disable_progress_bars()
    data, cache = sys.argv[1], sys.argv[2]
    ds = datasets.load_dataset("json", data_files=data, cache_dir=cache, split="train")
    print(len(ds))
"""


def _jsonl(sim: Sim) -> str:
    data = sim.work / "rows.jsonl"
    if not data.exists():
        data.write_text("".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(100)))
    return str(data)


def datasets_enosys(sim: Sim) -> tuple[Outcome, Outcome]:
    overlay = sim.work / "old-filelock"
    if not overlay.exists():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                        "--target", str(overlay), OLD_FILELOCK], check=True, capture_output=True)
    path, env = sim.shared_dir("lustre-noflock")
    old = run_py(LOAD, _jsonl(sim), str(path / "cache-a"),
                 env={**env, "PYTHONPATH": str(overlay), "SHAREDFS_DISABLE": "1"})
    new = run_py(LOAD, _jsonl(sim), str(path / "cache-b"), env=env)
    return (Outcome(old.returncode != 0, f"{OLD_FILELOCK}: {last_error(old)}"),
            Outcome(new.returncode != 0, "loaded 100 rows" if new.returncode == 0 else last_error(new)))


def datasets_enolck(sim: Sim) -> tuple[Outcome, Outcome]:
    path, env = sim.shared_dir("nfs-nolock")
    without = run_py(LOAD, _jsonl(sim), str(path / "cache-a"), env={**env, "SHAREDFS_DISABLE": "1"})
    with_ = run_py(LOAD, _jsonl(sim), str(path / "cache-b"), env=env)
    return (Outcome(without.returncode != 0, last_error(without)),
            Outcome(with_.returncode != 0, "loaded 100 rows" if with_.returncode == 0 else last_error(with_)))


COUNTER = """
    import os, sys, time
    lock_file, counter, which = sys.argv[1], sys.argv[2], sys.argv[3]
    if which == "sharedfs":
        import sharedfs
        lock = sharedfs.lock(lock_file)
    else:
        import filelock
        lock = filelock.FileLock(lock_file)
    for _ in range(10):
        with lock:
            try:
                with open(counter) as fh:
                    value = int(fh.read() or 0)
            except (FileNotFoundError, ValueError):  # another "holder" is replacing it right now
                value = 0
            time.sleep(0.002)
            with open(counter + f".{os.getpid()}", "w") as fh:
                fh.write(str(value + 1))
            os.replace(counter + f".{os.getpid()}", counter)
"""


def _counter_run(sim: Sim, which: str) -> Outcome:
    path, env = sim.shared_dir("localflock")
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(COUNTER), str(path / "c.lock"),
                               str(path / "count"), which], env={**env, "SHAREDFS_NODE_ID": f"node{i % 2}"},
                              stderr=subprocess.PIPE, text=True) for i in range(8)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    if any(p.returncode for p in procs):
        return Outcome(True, next(e for e in errors if e).strip().splitlines()[-1])
    value = int((path / "count").read_text())
    return Outcome(value != 80, f"counter {value}/80 ({80 - value} updates lost)")


def node_local_flock(sim: Sim) -> tuple[Outcome, Outcome]:
    return _counter_run(sim, "filelock"), _counter_run(sim, "sharedfs")


MAKEDIRS = """
    import os, sys, time
    target, how, delay = sys.argv[1], sys.argv[2], float(sys.argv[3])
    time.sleep(delay)
    if how == "os":
        os.makedirs(target, exist_ok=True)
    else:
        import sharedfs
        sharedfs.makedirs(target)
"""


def _makedirs_run(sim: Sim, how: str) -> Outcome:
    path, env = sim.shared_dir("lagging", lag_ms=2000)
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(MAKEDIRS), str(path / "run1"), how,
                               "0" if i < 4 else "0.5"], env={**env, "SHAREDFS_NODE_ID": f"node{i // 4}"},
                              stderr=subprocess.PIPE, text=True) for i in range(8)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    failed = [e for p, e in zip(procs, errors) if p.returncode]
    if failed:
        return Outcome(True, f"{len(failed)}/8 ranks: {failed[0].strip().splitlines()[-1][:120]}")
    return Outcome(False, "8/8 ranks see the directory")


def makedirs_race(sim: Sim) -> tuple[Outcome, Outcome]:
    return _makedirs_run(sim, "os"), _makedirs_run(sim, "sharedfs")


WAIT = """
    import os, sys, time
    target, how = sys.argv[1], sys.argv[2]
    start = time.monotonic()
    if how == "fixed":
        while not os.path.exists(target):
            if time.monotonic() - start > 1.0:
                raise TimeoutError(f"{os.path.basename(target)} not visible after a fixed 1.0 s wait")
            time.sleep(0.1)
    else:
        import sharedfs
        sharedfs.wait_for(target)
    print(f"{time.monotonic() - start:.1f}")
"""


def visibility_timeout(sim: Sim) -> tuple[Outcome, Outcome]:
    path, env = sim.shared_dir("lagging", lag_ms=2000)
    outcomes = []
    for how in ("fixed", "sharedfs"):
        target = path / f"made-by-rank0-{how}"
        waiter = subprocess.Popen([sys.executable, "-c", textwrap.dedent(WAIT), str(target), how],
                                  env={**env, "SHAREDFS_NODE_ID": "node1"}, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        time.sleep(0.3)
        run_py("import os, sys; os.mkdir(sys.argv[1])", str(target), env={**env, "SHAREDFS_NODE_ID": "node0"})
        out, err = waiter.communicate(timeout=60)
        if waiter.returncode:
            outcomes.append(Outcome(True, err.strip().splitlines()[-1][:140]))
        else:
            outcomes.append(Outcome(False, f"seen after {out.strip()} s (2 s lag)"))
    return outcomes[0], outcomes[1]


HOLD = """
    import sys, time
    which, lock_file = sys.argv[1], sys.argv[2]
    if which == "filelock":
        import filelock
        lock = filelock.SoftFileLock(lock_file)
    else:
        import sharedfs
        lock = sharedfs.lock(lock_file)
    lock.acquire()
    print("held", flush=True)
    time.sleep(600)
"""
TAKE = """
    import sys, time
    which, lock_file = sys.argv[1], sys.argv[2]
    start = time.monotonic()
    if which == "filelock":
        import filelock
        filelock.SoftFileLock(lock_file, timeout=8).acquire()
    else:
        import sharedfs
        sharedfs.lock(lock_file, timeout=8).acquire()
    print(f"{time.monotonic() - start:.1f}")
"""


def other_host_prefix() -> list[str]:
    """Run a command as if on another host: its own UTS namespace and host name, so nothing here
    can probe its pid, exactly as across real nodes (a user namespace makes this work without root)."""
    if not shutil.which("unshare"):
        return []
    user_ns = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return ["unshare", *user_ns, "--uts", "sh", "-c", 'hostname node-a && exec "$0" "$@"']


def stale_lock(sim: Sim) -> tuple[Outcome, Outcome]:
    """A job on node A is killed while holding an existence lock; the rerun on node B must not hang."""
    outcomes = []
    for which, extra in (("filelock", {}), ("sharedfs", {"SHAREDFS_LOCK": "lease", "SHAREDFS_LEASE_SECONDS": "2"})):
        lock_dir = sim.work / f"stale-{which}"
        lock_dir.mkdir()
        env = {**sim.base_env, **extra}
        holder = subprocess.Popen([*other_host_prefix(), sys.executable, "-c", textwrap.dedent(HOLD), which,
                                   str(lock_dir / "job.lock")], env={**env, "SHAREDFS_NODE_ID": "node-a"},
                                  stdout=subprocess.PIPE, text=True)
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        holder.send_signal(signal.SIGKILL)  # Slurm preemption, OOM killer, time limit
        holder.wait()
        taker = run_py(TAKE, which, str(lock_dir / "job.lock"), env={**env, "SHAREDFS_NODE_ID": "node-b"})
        if taker.returncode:
            outcomes.append(Outcome(True, f"rerun waits forever: {last_error(taker)[:110]}"))
        else:
            outcomes.append(Outcome(False, f"rerun took the lock after {taker.stdout.strip()} s (2 s lease)"))
    return outcomes[0], outcomes[1]


# -- wids and webdataset: real tar shards from a local HTTP server --------------------------------

SHARDS, SHARD_SAMPLES = 4, 10


def _shard_server(sim: Sim, delay: float) -> tuple[ShardServer, list[str], dict[str, str]]:
    """A fresh :class:`ShardServer` (closed by ``sim.stack``), its shard URLs, and the expected samples."""
    from .testing.shardserver import ShardServer, make_shards

    root = sim.work / "shards"
    expected = make_shards(root, count=SHARDS, samples=SHARD_SAMPLES)  # deterministic: rewriting is harmless
    server = sim.stack.enter_context(ShardServer(root, delay=delay, max_seconds=120))
    return server, server.urls(server.shard_names()), expected


def _readers(sim: Sim, code: str, args: list[str], env: dict[str, str], nodes: int, count: int,
             timeout: float = 90) -> list[subprocess.CompletedProcess[str]]:
    """``count`` reader processes over ``nodes`` simulated nodes, released together by a gate."""
    sim.counter += 1
    gate = str(sim.work / f"gate{sim.counter}")
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args, gate],
                              env={**env, "SHAREDFS_NODE_ID": f"node{i % nodes}", "SHAREDFS_TEST_INDEX": str(i),
                                   "SHAREDFS_TEST_COUNT": str(count)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(count)]
    done = []
    try:
        for proc in procs:
            try:
                out, err = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
                err += f"\nhung: killed after {timeout:.0f} s"
            done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    finally:  # Ctrl-C or an error: no reader outlives the demo
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return done


def _samples(proc: subprocess.CompletedProcess[str]) -> dict[str, str] | None:
    if proc.returncode:
        return None
    try:  # wids prints cache-miss warnings to stdout: the result is the last line
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return None


WIDS_READER = """
    import json, sys
    from sharedfs.testing.shardserver import sample_digest, start_together
    import wids
    urls, cache, samples, gate = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    start_together(gate)  # before wids touches the cache: a failing reader must not strand the others
    ds = wids.ShardListDataset([{"url": u, "nsamples": samples} for u in urls], cache_dir=cache,
                               transformations=[])
    got = {}
    for i in range(len(ds)):
        s = ds[i]
        data = s[".bin"]
        data = data.read() if hasattr(data, "read") else bytes(data)
        got[s["__key__"]] = sample_digest(s["__key__"], data)
    print(json.dumps(got))
"""


def wids_flockless(sim: Sim) -> tuple[Outcome, Outcome]:
    """Seed 001 / webdataset#386: wids' ULockFile flocks ``<shard>.tar.lock`` in the cache dir."""
    server, urls, expected = _shard_server(sim, delay=0.1)
    path, env = sim.shared_dir("nfs-nolock")
    outcomes = []
    for label, extra in (("plain", {"SHAREDFS_DISABLE": "1"}), ("sharedfs", {})):
        server.reset()
        results = _readers(sim, WIDS_READER, [json.dumps(urls), str(path / label), str(SHARD_SAMPLES)],
                           {**env, **extra}, nodes=2, count=2)
        broken = [r for r in results if _samples(r) != expected]
        if broken:
            outcomes.append(Outcome(True, f"{len(broken)}/2 readers: {last_error(broken[0])}"))
        else:
            fetches = server.counts()
            outcomes.append(Outcome(any(n != 1 for n in fetches.values()),
                                    f"2/2 readers (2 nodes) read all {len(expected)} samples; fetches per shard: "
                                    f"max {max(fetches.values())}"))
    return outcomes[0], outcomes[1]


WDS_READER = """
    import json, sys
    # webdataset runs without torch (its pytorch.py); not importing it spares 8 readers 2 s of CPU each.
    sys.modules["torch"] = None
    from sharedfs.testing.shardserver import sample_digest, start_together
    import webdataset as wds
    urls, cache, gate = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
    ds = wds.WebDataset(urls, cache_dir=cache, shardshuffle=False, empty_check=False)
    start_together(gate)  # the ranks of one job hit the server at once
    print(json.dumps({s["__key__"]: sample_digest(s["__key__"], s["bin"]) for s in ds}))
"""


def webdataset_duplicates(sim: Sim) -> tuple[Outcome, Outcome]:
    """webdataset's cache has no lock at all: every reader of a shared cache_dir downloads every shard."""
    server, urls, expected = _shard_server(sim, delay=0.3)
    # GPFS-like (flock excludes within a node only) under FUSE; ENOLCK NFS under the fallback.
    path, env = sim.shared_dir("localflock" if sim.fuse else "nfs-nolock")
    nodes = 2 if sim.fuse else 1
    outcomes = []
    for label, extra in (("plain", {"SHAREDFS_DISABLE": "1"}), ("sharedfs", {})):
        server.reset()
        (path / label).mkdir()  # webdataset refuses a cache_dir that does not exist
        results = _readers(sim, WDS_READER, [json.dumps(urls), str(path / label)], {**env, **extra},
                           nodes=nodes, count=8)
        fetches = [server.counts().get(name, 0) for name in server.shard_names()]
        where = f"8 readers on {nodes} node{'s' if nodes > 1 else ''}"
        broken = [r for r in results if _samples(r) != expected]
        evidence = f"{where}: fetches per shard: mean {sum(fetches) / len(fetches):.1f}, max {max(fetches)}"
        if broken:  # seen here: the shard missing right after the readers' concurrent renames onto it
            error = last_error(broken[0]).replace(f"{path}/", "")
            evidence += f"; {len(broken)}/8 readers crashed: {error[:100]}"
        outcomes.append(Outcome(bool(broken) or any(n != 1 for n in fetches), evidence))
    return outcomes[0], outcomes[1]


# -- the node-local-cache broadcast trap (failures.md section 5) ----------------------------------

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


def _on_node(sim: Sim, node: str, root: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run PICKLE on ``node``: its own mount namespace with a private tmpfs at ``root``."""
    user_ns = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]  # unprivileged mount namespace
    argv = ["unshare", *user_ns, "--mount", "--propagation", "private", "sh", "-c", PRIVATE_TMPFS, str(root),
            sys.executable, "-c", textwrap.dedent(PICKLE), *args]
    try:
        return subprocess.run(argv, capture_output=True, text=True, cwd="/", timeout=90, check=False,
                              env={**env, "SHAREDFS_NODE_ID": node})
    except subprocess.TimeoutExpired as exc:
        return subprocess.CompletedProcess(argv, -9, "", f"hung: killed after {exc.timeout:.0f} s")


def broadcast_trap(sim: Sim) -> tuple[Outcome, Outcome]:
    """Node A prepares a Dataset in its node-local cache and sends it pickled; node B cannot open it."""
    if not shutil.which("unshare"):
        raise RuntimeError("node-local disks are simulated with unshare (util-linux), which is not installed")
    data = _jsonl(sim)
    outcomes = []
    for label, extra in (("plain", {"SHAREDFS_DISABLE": "1"}), ("sharedfs", {"SHAREDFS_CACHE": "node-local"})):
        root = sim.work / f"node-local-{label}"
        root.mkdir()
        blob = sim.work / f"dataset-{label}.pickle"
        env = {**sim.base_env, **OFFLINE, **extra, "SHAREDFS_CACHE_ROOT": str(root), "HF_HOME": str(root / "hf_home")}
        if label == "plain":  # the user's own node-local cache, as seed 000 advises
            env["HF_DATASETS_CACHE"] = str(root / "hf_datasets")
        sent = _on_node(sim, "a", root, env, "send", data, str(blob))
        if sent.returncode:
            raise RuntimeError(f"node a could not prepare the dataset: {last_error(sent)}")
        got = _on_node(sim, "b", root, env, "receive", data, str(blob))
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


@dataclass(frozen=True)
class Scenario:
    name: str
    field_report: str
    run: Callable[[Sim], tuple[Outcome, Outcome]]
    needs_fuse: bool = False


SCENARIOS = (
    Scenario("datasets, Lustre without -o flock (ENOSYS)", "seed 000, datasets#6395", datasets_enosys),
    Scenario("datasets, NFS without lockd (ENOLCK)", "datasets#1672", datasets_enolck),
    Scenario("flock that excludes one node only (GPFS, localflock)", "filelock#389", node_local_flock, True),
    Scenario("8 ranks makedirs on a lagging filesystem", "seed 002, lingua#49", makedirs_race, True),
    Scenario("rank 0 made a dir, other node waits 1 s", "seed 003, OLMo#829", visibility_timeout, True),
    Scenario("lock of a killed job on another node", "srt-slurm#251, modelscope#1778", stale_lock),
    Scenario("wids cache on storage without flock (ENOLCK)", "seed 001, webdataset#386", wids_flockless),
    Scenario("8 webdataset readers share one cache_dir", "webdataset#386, failures.md 2", webdataset_duplicates),
    Scenario("Dataset from a node-local cache sent to another node", "LlamaFactory#3065, ms-swift#3667",
             broadcast_trap),
)


# -- driver -------------------------------------------------------------------------------------


def run_demo(*, use_fuse: bool | None = None, only: list[str] | None = None,
             progress: Callable[[str], None] = print) -> tuple[list[Result], str]:
    from .testing.hostilefs import fuse_available

    ok, why = fuse_available()
    fuse = ok if use_fuse is None else (use_fuse and ok)
    if ok and not fuse:
        why = "--no-fuse given"
    mode = "FUSE filesystems (hostilefs)" if fuse else f"LD_PRELOAD flock faults (no FUSE: {why})"
    progress(f"sharedfs demo: simulated cluster filesystem = {mode}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHAREDFS_", "HF_", "LD_PRELOAD"))}
    results = []
    with tempfile.TemporaryDirectory(prefix="sharedfs-demo-") as work, ExitStack() as stack:
        env["HF_HOME"] = str(Path(work) / "hf-home")
        sim = Sim(Path(work), stack, fuse, why, base_env=env)
        chosen = [s for s in SCENARIOS if not only or any(o in s.name for o in only)]
        for index, scenario in enumerate(chosen, 1):
            result = Result(scenario.name, scenario.field_report)
            started = time.monotonic()
            if scenario.needs_fuse and not fuse:
                result.skipped = f"needs FUSE to simulate a second node ({why})"
            else:
                try:
                    result.without, result.with_sharedfs = scenario.run(sim)
                    for outcome in (result.without, result.with_sharedfs):  # the temp dir says nothing
                        outcome.evidence = outcome.evidence.replace(f"{work}/", ".../")
                except Exception as exc:  # noqa: BLE001 - one broken scenario must not hide the others
                    result.skipped = f"could not run: {type(exc).__name__}: {exc}"
            result.seconds = time.monotonic() - started
            verdict = "fixed" if result.fixed else ("skipped" if result.skipped else "NOT FIXED")
            progress(f"[{index}/{len(chosen)}] {scenario.name}: {verdict} ({result.seconds:.1f} s)")
            results.append(result)
    return results, mode


def render(results: list[Result], mode: str) -> str:
    lines = [f"\nsimulated with: {mode}\n"]
    for r in results:
        lines.append(f"{r.name}  [{r.field_report}]")
        if r.skipped:
            lines.append(f"    skipped: {r.skipped}")
            continue
        assert r.without and r.with_sharedfs
        lines.append(f"    without sharedfs: {'FAILS' if r.without.failed else 'ok   '}  {r.without.evidence}")
        lines.append(f"    with sharedfs:    {'FAILS' if r.with_sharedfs.failed else 'ok   '}  "
                     f"{r.with_sharedfs.evidence}")
    fixed = sum(r.fixed for r in results)
    lines.append(f"\n{fixed} of {len(results)} field failures reproduced and fixed"
                 + (f"; {sum(bool(r.skipped) for r in results)} skipped" if any(r.skipped for r in results) else ""))
    return "\n".join(lines)


def main(args: object) -> int:
    as_json = getattr(args, "json", False)
    progress = (lambda line: print(line, file=sys.stderr)) if as_json else print
    try:
        results, mode = run_demo(use_fuse=False if getattr(args, "no_fuse", False) else None,
                                 only=getattr(args, "only", None), progress=progress)
    except KeyboardInterrupt:
        print("sharedfs demo: interrupted; everything it mounted and started was cleaned up", file=sys.stderr)
        return 130
    if as_json:
        print(json.dumps({"mode": mode, "scenarios": [{**asdict(r), "fixed": r.fixed} for r in results]}, indent=2))
    else:
        print(render(results, mode))
    return 0 if all(r.fixed or r.skipped for r in results) else 1

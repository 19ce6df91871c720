"""``sharedfs demo``: reproduce the field failures on this machine, then run them again with sharedfs.

Each scenario runs real programs in separate processes on a simulated cluster
filesystem: a FUSE filesystem when this process may mount one (root and
/dev/fuse), otherwise an ``LD_PRELOAD`` library that makes flock fail; the
scenarios that need a second node's view of the filesystem (lag, node-local
locks) run only under FUSE, and the table says so.  Everything mounted or
started is cleaned up, also on Ctrl-C.
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
from typing import Callable

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
)


# -- driver -------------------------------------------------------------------------------------


def run_demo(*, use_fuse: bool | None = None, only: list[str] | None = None,
             progress: Callable[[str], None] = print) -> tuple[list[Result], str]:
    from .testing.hostilefs import fuse_available

    ok, why = fuse_available()
    fuse = ok if use_fuse is None else (use_fuse and ok)
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

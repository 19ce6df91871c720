"""Scenarios of a flock that fails (datasets on ENOSYS/ENOLCK storage) or excludes one node only."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

from .sim import OLD_FILELOCK, Outcome, Sim, _jsonl, fetch_old_filelock, last_error, run_py

LOAD = """
    import json, sys
    import datasets
    datasets.disable_progress_bars()
    data, cache = sys.argv[1], sys.argv[2]
    ds = datasets.load_dataset("json", data_files=data, cache_dir=cache, split="train")
    print(len(ds))
"""


def datasets_enosys(sim: Sim) -> tuple[Outcome, Outcome]:
    overlay = fetch_old_filelock(sim)
    path, env = sim.shared_dir("lustre-noflock")
    old = run_py(LOAD, _jsonl(sim), str(path / "cache-a"),
                 env={**env, "PYTHONPATH": str(overlay), "SHAREDFS_DISABLE": "1"})
    new = run_py(LOAD, _jsonl(sim), str(path / "cache-b"), env={**env, "PYTHONPATH": str(overlay)})
    return (Outcome(old.returncode != 0, f"{OLD_FILELOCK}: {last_error(old)}"),
            Outcome(new.returncode != 0, f"{OLD_FILELOCK}: loaded 100 rows" if new.returncode == 0
                    else last_error(new)))


def datasets_enolck(sim: Sim) -> tuple[Outcome, Outcome]:
    path, env = sim.shared_dir("nfs-nolock")
    without = run_py(LOAD, _jsonl(sim), str(path / "cache-a"), env={**env, "SHAREDFS_DISABLE": "1"})
    with_ = run_py(LOAD, _jsonl(sim), str(path / "cache-b"), env=env)
    return (Outcome(without.returncode != 0, last_error(without)),
            Outcome(with_.returncode != 0, "loaded 100 rows" if with_.returncode == 0 else last_error(with_)))


# -- locks that exclude one node only ------------------------------------------------------------

COUNTER = """
    import json, os, sys, time
    lock_file, counter, which, gate, count = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
    if which == "sharedfs":
        import sharedfs
        lock = sharedfs.lock(lock_file)
    else:
        import filelock
        lock = filelock.FileLock(lock_file)
    # Start together: on a loaded machine the first processes could otherwise finish before the last start.
    open(os.path.join(gate, str(os.getpid())), "w").close()
    deadline = time.monotonic() + 120
    while len(os.listdir(gate)) < count and time.monotonic() < deadline:
        time.sleep(0.005)
    holds = []  # (entered, left, value read, value written): what the scenario's cause is derived from
    for _ in range(10):
        with lock:
            entered = time.monotonic()  # one clock for every process of this machine, whatever its "node"
            try:
                with open(counter) as fh:
                    value = int(fh.read() or 0)
            except (FileNotFoundError, ValueError):  # another "holder" is replacing it right now
                value = 0
            time.sleep(0.002)
            with open(counter + f".{os.getpid()}", "w") as fh:
                fh.write(str(value + 1))
            os.replace(counter + f".{os.getpid()}", counter)
            holds.append((entered, time.monotonic(), value, value + 1))
    print(json.dumps(holds))
"""
COUNTER_PROCESSES, COUNTER_HOLDS = 8, 80


@dataclass(frozen=True)
class Holds:
    """What the counter's holders did, from their own records: who overlapped whom, who read a stale value."""

    holds: int
    handovers: int
    overlapped: int  # handovers where the next holder entered before the last one left
    stale: int  # reads of something other than what the last holder to leave had written

    @classmethod
    def of(cls, records: list[tuple[float, float, int, int]]) -> Holds:
        records = sorted(records)
        overlapped = stale = 0
        left_last = float("-inf")
        for i, (entered, left, read, _) in enumerate(records):
            if i and entered < left_last:
                overlapped += 1
            left_last = max(left_last, left)
            before = [(lft, wrote) for _, lft, _, wrote in records if lft <= entered]
            if read != max(before, default=(0.0, 0))[1]:
                stale += 1
        return cls(len(records), max(len(records) - 1, 0), overlapped, stale)

    def text(self) -> str:
        return (f"{self.overlapped} of {self.handovers} handovers overlapped, "
                f"{self.stale} of {self.holds} reads stale")

    def cause(self, fs: str) -> str:
        """The cause this run showed (two holders at once outranks a stale read: it explains both)."""
        if self.overlapped:
            return (f"node-local flock: two holders at once in {self.overlapped} of {self.handovers} handovers "
                    "(flock excluded only the processes of one node)")
        if self.stale:
            return (f"the next holder read a stale value through the client cache ({self.stale} of {self.holds} "
                    f"reads); flock excluded across nodes (0 of {self.handovers} handovers overlapped)")
        return (f"not reproduced on {fs}: flock excluded across nodes and every holder read the last value "
                f"(0 of {self.handovers} handovers overlapped, 0 stale reads)")


def _counter_run(sim: Sim, which: str) -> Outcome:
    if sim.real:  # one client mount per node: a process reaches the volume through its node's own mount
        dirs = sim.node_dirs()
        env = dict(sim.base_env)
        # The lock file exists on every node before the start, as after a first run: else a lagging mount's
        # negative entry cache holds the second node's open(O_CREAT) for its 3 s while the first node's
        # processes finish all their holds, and the run shows no overlap whatever the locks do.
        (dirs[0] / "c.lock").touch()
        deadline = time.monotonic() + 30
        while not all((d / "c.lock").exists() for d in dirs) and time.monotonic() < deadline:
            time.sleep(0.1)
    else:
        path, env = sim.shared_dir("localflock")
        dirs = [path, path]
    gate = Path(tempfile.mkdtemp(prefix=f"gate-{which}-", dir=sim.work))  # local: every process sees it at once
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(COUNTER), str(dirs[i % 2] / "c.lock"),
                               str(dirs[i % 2] / "count"), which, str(gate), str(COUNTER_PROCESSES)],
                              env={**env, "SHAREDFS_NODE_ID": f"node{i % 2}"},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(COUNTER_PROCESSES)]
    done = [p.communicate(timeout=300) for p in procs]
    if any(p.returncode for p in procs):
        error = next(err for p, (_, err) in zip(procs, done) if p.returncode).strip().splitlines()[-1]
        return Outcome(True, error, cause=f"a holder crashed: {error[:120]}")
    holds = Holds.of([tuple(h) for out, _ in done for h in json.loads(out.strip().splitlines()[-1])])
    if sim.real:  # node 0's cache may still show an older counter than the last holder wrote
        from sharedfs.demo.realfs import LAG_S

        time.sleep(LAG_S + 0.5)
    value = int((dirs[0] / "count").read_text())
    return Outcome(value != COUNTER_HOLDS, f"counter {value}/{COUNTER_HOLDS} ({COUNTER_HOLDS - value} updates lost); "
                                           f"{holds.text()}", cause=holds.cause(sim.fs))


def node_local_flock(sim: Sim) -> tuple[Outcome, Outcome]:
    return _counter_run(sim, "filelock"), _counter_run(sim, "sharedfs")

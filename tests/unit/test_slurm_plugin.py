"""The slurm plugin's liveness answer without a cluster: a fake ``squeue`` on PATH, real processes.

What a real Slurm says is in tests/integration/test_slurm.py; here: which ids reach a command
line, how the answers are decided, and that the processes of one node share one query.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from sharedfs.model.policy import resolve
from sharedfs.model.records import HolderRecord
from sharedfs.plugins import slurm as plugin

FAKE_SQUEUE = """#!/bin/sh
# Logs each call, then answers from files: steps for `squeue -s`, jobs otherwise.
echo "$*" >> "$FAKE_SLURM/calls"
/bin/sleep "$(/bin/cat "$FAKE_SLURM/delay" 2>/dev/null || echo 0)"
case " $* " in
  *" -s "*) /bin/cat "$FAKE_SLURM/steps" 2>/dev/null ;;
  *) /bin/cat "$FAKE_SLURM/jobs" 2>/dev/null ;;
esac
"""

NOW = time.time()


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory with a fake squeue (first on PATH), its answers and its call log; plugin state reset."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    squeue = bin_dir / "squeue"
    squeue.write_text(FAKE_SQUEUE)
    squeue.chmod(0o755)
    state = tmp_path / "slurm"
    state.mkdir()
    (state / "calls").write_text("")
    shm = tmp_path / "shm"
    shm.mkdir(mode=0o700)
    monkeypatch.setenv("FAKE_SLURM", str(state))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/nonexistent")  # no real scontrol either
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(plugin, "SHARED_PARENTS", (str(shm),))
    monkeypatch.setattr(plugin, "_shared_dir_memo", [])
    monkeypatch.setattr(plugin, "_cache", {})
    monkeypatch.setattr(plugin, "_warned", set())
    monkeypatch.setattr(plugin, "_private", [False])
    monkeypatch.setattr(plugin, "_nodes", {"n1": True})
    return state


def calls(state: Path) -> list[str]:
    return (state / "calls").read_text().splitlines()


def record(job: str | None = "77", step: str | None = "0", acquired_at: float = NOW, node: str = "n1") -> HolderRecord:
    return HolderRecord(node=node, pid=4242, acquired_at=acquired_at, kind="soft", host=node, slurm_job=job,
                        slurm_step=step, slurm_node=node)


def alive(rec: HolderRecord) -> bool | None:
    plugin._cache.clear()  # each question asked afresh (the node-wide file is keyed the same: clear it too)
    for path in Path(plugin.SHARED_PARENTS[0]).glob("sharedfs-*/slurm/*.json"):
        path.unlink()
    return plugin.sharedfs_holder_alive(rec, resolve([]))


# -- ids: the record is untrusted, only strict ids reach squeue -------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("123", "123"), (" 123 ", "123"), ("123_4", "123_4"), ("123+1", "123+1"),
    ("0", None), ("-1", None), ("123;id", None), ("1 2", None), ("123.0", None), ("12345678901", None),
    ("--all", None), ("", None), (None, None),
])
def test_job_ids_are_what_squeue_accepts_and_nothing_else(text: str | None, expected: str | None) -> None:
    assert plugin.job_id(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("0", "0"), ("007", "7"), ("batch", "batch"), ("extern", "extern"), ("interactive", "interactive"),
    # SLURM_STEP_ID of the special steps is a number (slurm.h); squeue prints the name.
    ("4294967290", "interactive"), ("4294967291", "batch"), ("4294967292", "extern"),
    ("4294967293", None),  # a pending step has no processes
    ("Batch", None), ("0+1", None), ("1;id", None), ("", None), (None, None),
])
def test_step_ids(text: str | None, expected: str | None) -> None:
    assert plugin.step_id(text) == expected


# -- decisions ---------------------------------------------------------------------------------------

F = plugin.SlurmFacts


@pytest.mark.parametrize("facts, step, expected", [
    (F(step_listed=True, started=NOW - 60), "0", True),
    (F(step_listed=True, started=NOW + 2 * plugin.CLOCK_SLACK), "0", False),  # a requeued job's new step 0
    (F(step_listed=True, started=NOW + 10), "0", True),                      # within clock skew: alive
    (F(state="RUNNING", started=NOW - 60), "0", False),    # the job runs, the holder's step is gone
    (F(state="RUNNING", started=NOW - 60), None, True),    # a batch script's holder: alive with its job
    (F(state="RUNNING", started=NOW - 60, het=True), "0", True),  # het: the step id names no step
    (F(state="RUNNING", started=NOW + 2 * plugin.CLOCK_SLACK), None, False),  # requeued and restarted
    (F(state="COMPLETING"), "0", True),                    # steps may be half torn down: wait for the end
    (F(state="SUSPENDED"), "0", True),
    (F(state="PENDING", started=NOW + 2 * plugin.CLOCK_SLACK), None, True),  # a planned start proves nothing
    (F(state="CANCELLED"), "0", False),
    (F(state="CANCELLED"), None, False),
    (F(state="UNKNOWN"), "0", False),                      # purged: over (node n1 is ours, jobs not private)
    (F(state="SOMETHING_NEW"), "0", None),
    (F(error="squeue did not answer"), "0", None),
])
def test_decide(facts: plugin.SlurmFacts, step: str | None, expected: bool | None, monkeypatch) -> None:
    monkeypatch.setattr(plugin, "_private", [False])
    monkeypatch.setattr(plugin, "_nodes", {"n1": True, "elsewhere": False})
    assert plugin.decide(facts, step, "n1", NOW) is expected


def test_unknown_job_proves_nothing_when_private_or_foreign(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plugin, "_nodes", {"n1": True, "elsewhere": False})
    monkeypatch.setattr(plugin, "_private", [False])
    assert plugin.decide(F(state="UNKNOWN"), "0", "elsewhere", NOW) is None
    monkeypatch.setattr(plugin, "_private", [True])
    assert plugin.decide(F(state="UNKNOWN"), "0", "n1", NOW) is None


# -- what is asked ---------------------------------------------------------------------------------


def test_a_listed_step_costs_one_query_and_a_missing_one_two(fake: Path) -> None:
    (fake / "steps").write_text(f"77|77.0|{NOW - 60:.0f}|\n77|77.batch|{NOW - 60:.0f}|\n")
    (fake / "jobs").write_text(f"77|77|RUNNING|{NOW - 60:.0f}\n")
    assert alive(record(step="0")) is True
    assert calls(fake) == ["-h --all -s -j 77 -O JobId:|,StepId:|,StartTime:|"]
    assert alive(record(step="4294967291")) is True  # the batch step, by number
    assert alive(record(step="1")) is False          # step 1 ended, the job runs on
    assert calls(fake)[-1] == "-h --all --states=all -j 77 -o %A|%i|%T|%S"
    assert alive(record(step=None)) is True          # a batch script's holder: no step query at all
    assert len(calls(fake)) == 5


def test_array_and_het_jobs(fake: Path) -> None:
    # squeue -j of an array's base id lists every task: only the raw id asked for counts.
    (fake / "steps").write_text(f"77|77_1.batch|{NOW:.0f}|\n78|77_0.0|{NOW:.0f}|\n")
    (fake / "jobs").write_text(f"77|77_1|RUNNING|{NOW:.0f}\n78|77_0|RUNNING|{NOW:.0f}\n")
    assert alive(record(step="0")) is False          # 77_0.0 is job 78's step 0, not ours
    assert alive(record(job="77_0", step="0")) is True
    # squeue -j of a het leader lists each component; a component's steps are not named by its
    # SLURM_JOB_ID.SLURM_STEP_ID, so only the job counts.
    (fake / "steps").write_text(f"77|77.batch|{NOW:.0f}|\n78|78.0|{NOW:.0f}|\n")
    (fake / "jobs").write_text(f"77|77+0|RUNNING|{NOW:.0f}\n78|77+1|RUNNING|{NOW:.0f}\n")
    assert alive(record(step="0")) is True
    (fake / "jobs").write_text(f"77|77+0|COMPLETED|{NOW:.0f}\n78|77+1|COMPLETED|{NOW:.0f}\n")
    assert alive(record(step="0")) is False


def test_refused_ids_never_reach_a_command(fake: Path) -> None:
    for rec in (record(job="77;touch x"), record(job="--all"), record(step="0;id"), record(step="--help")):
        assert alive(rec) is None
    assert calls(fake) == []


def test_output_it_cannot_read_is_cannot_tell(fake: Path, caplog: pytest.LogCaptureFixture) -> None:
    # An squeue that ignores the -O suffixes: never read "step not listed" into it.
    (fake / "steps").write_text("77 77.0 1795365407\n")
    (fake / "jobs").write_text(f"77|77|RUNNING|{NOW:.0f}\n")
    assert alive(record(step="0")) is None
    assert "cannot ask Slurm whether job 77 still runs (cannot read `squeue -s` output" in caplog.text


def test_an_unanswering_squeue_is_warned_once_per_process(fake: Path, monkeypatch, caplog) -> None:
    (fake / "delay").write_text("3")
    monkeypatch.setattr(plugin, "QUERY_TIMEOUT", 0.3)
    assert alive(record()) is None
    assert plugin.sharedfs_holder_alive(record(), resolve([])) is None  # cached "cannot tell"
    warnings = [r.getMessage() for r in caplog.records if "cannot ask Slurm" in r.getMessage()]
    assert len(warnings) == 1 and "did not answer within 0.3 s" in warnings[0], warnings
    assert "waited out (SHAREDFS_WAIT_TIMEOUT) instead of broken" in warnings[0]


# -- the node-wide cache --------------------------------------------------------------------------

WAITER = """
import sys, time
from sharedfs.model.policy import resolve
from sharedfs.plugins import slurm as plugin
from sharedfs.model.records import HolderRecord
plugin.SHARED_PARENTS = (sys.argv[1],)
plugin.SHARED_CACHE = sys.argv[2] == "shared"
rec = HolderRecord(node="n1", pid=4242, acquired_at=time.time(), kind="soft", slurm_job="77", slurm_step="0",
                   slurm_node="n1")
policy = resolve([])
start = time.monotonic()
while time.time() < float(sys.argv[3]):   # all start and stop together, as ranks released by one event
    time.sleep(0.001)
answers = set()
while time.time() < float(sys.argv[4]):
    answers.add(plugin.sharedfs_holder_alive(rec, policy))
    time.sleep(0.01)                       # a lock waiter's poll
print(sorted(map(str, answers)))
"""


def run_waiters(fake: Path, tmp_path: Path, mode: str, n: int, seconds: float) -> tuple[int, list[str]]:
    script = tmp_path / "waiter.py"
    script.write_text(textwrap.dedent(WAITER))
    (fake / "calls").write_text("")
    begin = time.time() + 1.0
    procs = [subprocess.Popen([sys.executable, str(script), plugin.SHARED_PARENTS[0], mode, str(begin),
                               str(begin + seconds)], stdout=subprocess.PIPE, text=True) for _ in range(n)]
    outputs = [proc.communicate(timeout=60)[0].strip() for proc in procs]
    return len(calls(fake)), outputs


def test_one_query_per_node_per_interval_whatever_the_number_of_waiters(fake: Path, tmp_path: Path) -> None:
    (fake / "steps").write_text(f"77|77.0|{NOW:.0f}|\n")
    (fake / "delay").write_text("0.2")  # a slow controller widens the window in which all find it expired
    seconds = 4.0
    shared, outputs = run_waiters(fake, tmp_path, "shared", 8, seconds)
    assert outputs == ["['True']"] * 8
    # One query per CACHE_SECONDS (+ the query's own 0.2 s), for all 8 processes together.
    assert shared <= seconds / plugin.CACHE_SECONDS + 1, calls(fake)
    # The baseline: each process caches for itself, so 8 processes ask 8 times as often.
    alone, outputs = run_waiters(fake, tmp_path, "per-process", 8, seconds)
    assert outputs == ["['True']"] * 8
    assert alone >= 8 * (seconds / (plugin.CACHE_SECONDS + 0.2)) - 1, alone
    print(f"squeue calls in {seconds:g} s by 8 waiters: shared {shared}, per process {alone}")


def test_the_cache_directory_is_private_or_not_used(fake: Path, tmp_path: Path) -> None:
    (fake / "steps").write_text(f"77|77.0|{NOW:.0f}|\n")
    parent = Path(plugin.SHARED_PARENTS[0])
    mine = parent / f"sharedfs-{os.geteuid()}"
    assert plugin._private_dir(str(parent)) == str(mine / "slurm")
    assert (mine.stat().st_mode & 0o777, (mine / "slurm").stat().st_mode & 0o777) == (0o700, 0o700)

    victim = tmp_path / "victim"
    victim.mkdir()
    for plant in ("symlink", "group-writable", "foreign"):
        if mine.is_symlink():
            mine.unlink()
        else:
            shutil.rmtree(mine, ignore_errors=True)
        if plant == "symlink":
            mine.symlink_to(victim)
        else:
            mine.mkdir(mode=0o700)
            if plant == "group-writable":
                mine.chmod(0o770)
            elif os.geteuid() == 0:
                os.chown(mine, 4242, 4242)
            else:
                continue  # cannot give a directory away without root
        assert plugin._private_dir(str(parent)) is None, plant
        # Nothing is written through it, and liveness still works (each process on its own).
        plugin._shared_dir_memo.clear()
        assert alive(record()) is True
        assert list(victim.iterdir()) == []


@pytest.mark.parametrize("plant", ["symlink", "fifo", "huge", "garbage", "wrong key", "far future"])
def test_a_planted_cache_file_is_ignored_and_replaced(fake: Path, tmp_path: Path, plant: str) -> None:
    (fake / "steps").write_text(f"77|77.0|{NOW:.0f}|\n")
    directory = plugin._shared_dir()
    assert directory is not None
    key = f"{__import__('zlib').crc32(os.environ['SLURM_CONF'].encode()):08x}-77.0"
    path = Path(directory) / f"{key}.json"
    lie = '{"key":"%s","expires":%f,"facts":{"state":"CANCELLED","started":null,"step_listed":false,' \
          '"het":false,"error":null}}'
    target = tmp_path / "target"
    target.write_text(lie % (key, time.time() + 1))
    if plant == "symlink":
        path.symlink_to(target)
    elif plant == "fifo":
        os.mkfifo(path)
    elif plant == "huge":
        path.write_text(lie % (key, time.time() + 1) + " " * 4096)
    elif plant == "garbage":
        path.write_bytes(b"\xff{not json")
    elif plant == "wrong key":
        path.write_text(lie % ("00000000-77.0", time.time() + 1))
    else:
        path.write_text(lie % (key, time.time() + 3600))
    plugin._cache.clear()
    assert plugin.sharedfs_holder_alive(record(), resolve([])) is True  # asked Slurm instead
    assert len(calls(fake)) == 1
    assert '"step_listed":true' in path.read_text() and not path.is_symlink()
    assert '"CANCELLED"' in target.read_text()  # a symlink's target is never written through


def test_stale_entries_are_swept(fake: Path) -> None:
    directory = Path(plugin._shared_dir())
    old, new = directory / "old.json", directory / "new.json"
    old.write_text("{}")
    new.write_text("{}")
    os.utime(old, (time.time() - 2 * plugin.STALE_SECONDS,) * 2)
    plugin._sweep(str(directory))
    assert (old.exists(), new.exists()) == (False, True)


def test_a_big_job_asks_the_scheduler_at_a_constant_rate_whatever_its_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """rl_enable gives a user 2 RPCs per second by default; 1,024 nodes asking every 2 s would be 512."""
    for nodes in (1, 2):
        monkeypatch.setenv("SLURM_JOB_NUM_NODES", str(nodes))
        assert plugin._lifetime() == plugin.CACHE_SECONDS  # small jobs: as before
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "1024")
    lifetimes = [plugin._lifetime() for _ in range(2000)]
    assert 0.75 * 1024 <= min(lifetimes) and max(lifetimes) <= 1.25 * 1024
    job_rate = sum(1 / lifetime for lifetime in lifetimes) / len(lifetimes) * 1024
    assert job_rate <= 1.1 * plugin.JOB_QUERY_RATE, job_rate
    now = 1e9
    assert plugin._fresh(now + max(lifetimes), now) and not plugin._fresh(now + 1.3 * 1024, now)

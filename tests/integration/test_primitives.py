"""The primitives on filesystems that fail the way clusters do (FUSE profiles, real processes).

Each test first shows what goes wrong with what users have today (raw filelock,
os.makedirs, a fixed-timeout wait), then that sharedfs's primitive does not.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import clean_env
from helpers.locktools import run_workers

pytestmark = pytest.mark.slow
NODES = {"nodeA": 4, "nodeB": 4}


def _work(mount) -> Path:
    work = Path(mount.path) / "work"
    work.mkdir()
    return work


def test_raw_filelock_on_localflock_loses_updates_and_sharedfs_loses_none(hostile_mount) -> None:
    before = _work(hostile_mount("localflock"))
    value, overlaps, _ = run_workers(before, NODES, 10, which="filelock")
    assert overlaps > 0 and value < 80, "the test must be able to fail: node-local flock did not overlap"

    after = _work(hostile_mount("localflock"))
    value, overlaps, kinds = run_workers(after, NODES, 10)
    assert (value, overlaps, kinds) == (80, 0, {"soft"})


@pytest.mark.parametrize(("profile", "error"), [("lustre-noflock", None), ("nfs-nolock", "No locks available")])
def test_flockless_profiles_break_raw_filelock_or_not_sharedfs(hostile_mount, profile: str, error) -> None:
    mount = hostile_mount(profile)
    probe = subprocess.run(
        [sys.executable, "-c", "import filelock, sys\nwith filelock.FileLock(sys.argv[1]): print('held')",
         str(Path(mount.path) / "x.lock")], capture_output=True, text=True, env=clean_env())
    if error:  # NFS without lockd: no filelock release falls back, the job dies (datasets#1672)
        assert probe.returncode != 0 and error in probe.stderr
    else:  # Lustre: filelock >= 3.24 falls back to SoftFileLock with a warning; older raises (datasets#6395)
        assert "flock" in probe.stderr.lower() or probe.returncode != 0
    value, overlaps, kinds = run_workers(_work(mount), NODES, 10)
    assert (value, overlaps, kinds) == (80, 0, {"soft"})


MAKEDIRS = textwrap.dedent("""
    import os, sys, time
    target, how, delay = sys.argv[1], sys.argv[2], float(sys.argv[3])
    time.sleep(delay)
    if how == "os":
        os.makedirs(target, exist_ok=True)
    else:
        import sharedfs
        sharedfs.makedirs(target)
        assert os.path.isdir(target)
    print("ok")
""")


def _race(mount, how: str, lag: float, relative: str) -> list[subprocess.CompletedProcess]:
    target = str(Path(mount.path) / relative)
    procs = []
    for index in range(8):
        node = "nodeA" if index < 4 else "nodeB"
        delay = 0.0 if node == "nodeA" else lag / 4  # node B arrives inside node A's lag window
        procs.append(subprocess.Popen([sys.executable, "-c", MAKEDIRS, target, how, str(delay)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env=clean_env({"SHAREDFS_NODE_ID": node, "SHAREDFS_WAIT_TIMEOUT": "30"})))
    return [subprocess.CompletedProcess(p.args, p.wait(60), *p.communicate()) for p in procs]


@pytest.mark.parametrize(("relative", "errors"), [
    ("run1", ("FileExistsError",)),  # mkdir says EEXIST, isdir says no: lingua#49
    ("ckpt/run1", ("FileExistsError", "FileNotFoundError")),  # the parent is not visible yet either
])
def test_makedirs_races_on_a_lagging_filesystem(hostile_mount, relative: str, errors: tuple) -> None:
    lag = 2.0
    results = _race(hostile_mount("lagging", lag_ms=int(lag * 1000)), "os", lag, relative)
    failed = [r for r in results if r.returncode != 0]
    assert failed and all(any(e in r.stderr for e in errors) for r in failed), [r.stderr for r in failed]

    results = _race(hostile_mount("lagging", lag_ms=int(lag * 1000)), "sharedfs", lag, relative)
    assert [r.returncode for r in results] == [0] * 8, [r.stderr for r in results if r.returncode]


WAITER = textwrap.dedent("""
    import os, sys, time
    target, how = sys.argv[1], sys.argv[2]
    start = time.monotonic()
    if how == "fixed":  # OLMo#829: non-zero ranks poll exists() with a fixed timeout
        while not os.path.exists(target):
            if time.monotonic() - start > float(sys.argv[3]):
                raise TimeoutError(f"{target} not visible after {sys.argv[3]} s")
            time.sleep(0.1)
    else:
        import sharedfs
        sharedfs.wait_for(target)
    print(f"{time.monotonic() - start:.2f}")
""")


def test_fixed_timeout_waits_pass_only_by_luck_and_wait_for_does_not(hostile_mount) -> None:
    lag = 2.0
    mount = hostile_mount("lagging", lag_ms=int(lag * 1000))
    made = Path(mount.path) / "made_by_rank0"

    def waiters(how: str, fixed_timeout: float) -> list[subprocess.Popen]:
        return [subprocess.Popen([sys.executable, "-c", WAITER, str(made) + how, how, str(fixed_timeout)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env=clean_env({"SHAREDFS_NODE_ID": "nodeB", "SHAREDFS_WAIT_TIMEOUT": "30"}))
                for _ in range(4)]

    # The scaled-down OLMo wait: its 10 s timeout against minutes of NFS lag becomes 1 s against 2 s.
    fixed, patient = waiters("fixed", lag / 2), waiters("sharedfs", 0)
    time.sleep(0.3)
    subprocess.run([sys.executable, "-c", f"import os; os.mkdir({str(made) + 'fixed'!r}); "
                    f"os.mkdir({str(made) + 'sharedfs'!r})"], check=True, env=clean_env({"SHAREDFS_NODE_ID": "nodeA"}))
    fixed_results = [(p.wait(30), p.communicate()) for p in fixed]
    assert all(code != 0 and "not visible after" in err for code, (_, err) in fixed_results)
    waited = []
    for proc in patient:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        waited.append(float(out))
    assert all(lag * 0.7 < w < lag + 3 for w in waited), waited  # waited out the lag, overshoot bounded


def test_wait_for_timeout_explains_what_where_and_what_to_change(hostile_mount) -> None:
    mount = hostile_mount("lagging", lag_ms=500)
    proc = subprocess.run([sys.executable, "-c", "import sharedfs, sys; sharedfs.wait_for(sys.argv[1], timeout=0.5)",
                           str(Path(mount.path) / "never")], capture_output=True, text=True,
                          env=clean_env({"SHAREDFS_NODE_ID": "nodeB"}))
    assert proc.returncode == 1
    assert "sharedfs.errors.WaitTimeout: waited 0.5 s for" in proc.stderr
    assert "on node nodeB, rank 0 of 1; it is on fuse (fuse.hostilefs" in proc.stderr
    assert "raise SHAREDFS_WAIT_TIMEOUT" in proc.stderr and "sharedfs doctor" in proc.stderr

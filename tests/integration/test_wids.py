"""wids on cluster-like storage: real wids 0.1.11 (or webdataset 0.2's copy), real HTTP shards, real processes.

Each test first shows plain wids (``SHAREDFS_DISABLE=1``) failing the way
webdataset#386 describes -- its ``ULockFile`` cannot lock where flock
is missing and gives no exclusion once it unlinks its lock file, a killed
download leaves a truncated shard every later reader trusts, cleanup deletes
shards being read -- and then the same user code working with sharedfs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import clean_env, require

from sharedfs.demo.nodes import assert_all_ok, run_on_nodes
from sharedfs.demo.shardserver import ShardServer, make_shards, wait_until

require("wids", "needs wids==0.1.11 (scripts/requirements-test.txt)")
require("torch", "needs torch==2.13.0: wids imports torch.distributed")

pytestmark = pytest.mark.slow
TESTS = str(Path(__file__).resolve().parents[1])
SAMPLES = 20
NODES = {"nodeA": 4, "nodeB": 4}

# A user's reader: every sample of a ShardListDataset whose shards come over HTTP.
READER = textwrap.dedent("""
    import json, os, random, sys
    sys.path.insert(0, os.environ["T_TESTS"])
    from sharedfs.demo.shardserver import sample_digest, start_together
    import wids
    urls = json.loads(os.environ["T_URLS"])
    ds = wids.ShardListDataset([{"url": u, "nsamples": NSAMPLES} for u in urls], cache_dir=os.environ["T_CACHE"],
                               transformations=[], lru_size=int(os.environ.get("T_LRU", "10")))
    order = list(range(len(ds))) * int(os.environ.get("T_EPOCHS", "1"))
    if os.environ.get("T_SHUFFLE", "1") == "1":
        random.Random(int(os.environ["SHAREDFS_TEST_INDEX"])).shuffle(order)
    if os.environ.get("T_GATE"):
        start_together(os.environ["T_GATE"])
    got = {}
    for i in order:
        s = ds[i]
        data = s[".bin"]
        data = data.read() if hasattr(data, "read") else bytes(data)
        got[s["__key__"]] = sample_digest(s["__key__"], data)
    print(json.dumps(got))
""").replace("NSAMPLES", str(SAMPLES))


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("shards")
    return root, make_shards(root, count=8, samples=SAMPLES)


def _last_json(stdout: str):
    return json.loads(stdout.strip().splitlines()[-1])  # wids prints cache-miss warnings to stdout


def _env(**extra: object) -> dict[str, str]:
    env = clean_env({"T_TESTS": TESTS, "SHAREDFS_STRICT": "1"})
    env.update({k: str(v) for k, v in extra.items()})
    return env


@pytest.mark.parametrize(("profile", "message"), [("lustre-noflock", "[Errno 38] Function not implemented"),
                                                   ("nfs-nolock", "[Errno 37] No locks available")])
def test_wids_cache_on_flockless_storage_fails_without_sharedfs_and_works_with(
        hostile_mount, shards, tmp_path, profile: str, message: str) -> None:
    root, expected = shards
    mount = hostile_mount(profile)
    with ShardServer(root, delay=0.1) as server:
        urls = json.dumps(server.urls(server.shard_names()))
        (mount.backing / "plain").mkdir()
        plain = run_on_nodes([sys.executable, "-c", READER], {"nodeA": 1, "nodeB": 1}, timeout=120,
                             env=_env(T_URLS=urls, T_CACHE=mount.path / "plain", SHAREDFS_DISABLE="1"))
        # Plain wids: ULockFile's flock fails on every node (an OSError).
        assert [r.returncode for r in plain] == [1, 1]
        assert all(f"OSError: {message}" in r.stderr for r in plain), [r.stderr[-1500:] for r in plain]

        server.reset()
        (mount.backing / "sharedfs").mkdir()
        results = run_on_nodes([sys.executable, "-c", READER], NODES, timeout=120,
                               env=_env(T_URLS=urls, T_CACHE=mount.path / "sharedfs", T_GATE=tmp_path / "gate",
                                        SHAREDFS_LOG="info"))
        assert_all_ok(results)
        assert all(_last_json(r.stdout) == expected for r in results)
        assert server.counts() == {name: 1 for name in server.shard_names()}  # once for all 8 processes
    # FUSE: no trustworthy lock, so an existence lock was chosen (by the processes that took one: the
    # others of a node found the shard their node's first reader fetched, without the lock).
    assert any("-> soft" in r.stderr for r in results)


# webdataset#386's mechanism, without any network: ULockFile unlinks its lock file on release,
# so a waiter that opened the old inode and a newcomer that creates a new one both "hold" it.
COUNTER = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, os.environ["T_TESTS"])
    from sharedfs.demo.shardserver import start_together
    from wids.wids_dl import ULockFile
    counter, lock = sys.argv[1], sys.argv[1] + ".lock"
    start_together(sys.argv[2])
    for _ in range(30):
        with ULockFile(lock):
            value = int(open(counter).read() or 0)
            time.sleep(0.005)  # long enough that the releaser loops back while the next holder holds
            with open(counter, "w") as fh:
                fh.write(str(value + 1))
""")


def test_ulockfile_unlink_loses_exclusion_and_sharedfs_lock_does_not(tmp_path) -> None:
    totals = {}
    for label, extra in (("plain", {"SHAREDFS_DISABLE": "1"}), ("sharedfs", {})):
        counter = tmp_path / f"{label}.count"
        counter.write_text("0")
        results = run_on_nodes([sys.executable, "-c", COUNTER, str(counter), str(tmp_path / f"gate-{label}")],
                               {"node": 3}, env=_env(**extra),
                               timeout=120)
        assert_all_ok(results)
        totals[label] = int(counter.read_text())
    # Two holders at once lose updates (a lower count) or interleave two writes of the counter (a
    # higher one: "9" written over "10" leaves "90"): either way not 90.
    assert totals["plain"] != 90, f"plain ULockFile should have let two processes in at once: {totals}"
    assert totals["sharedfs"] == 90, totals


GET = textwrap.dedent("""
    import sys, wids
    ds = wids.ShardListDataset([{"url": sys.argv[2], "nsamples": NSAMPLES}], cache_dir=sys.argv[1], transformations=[])
    print(len([ds[i] for i in range(len(ds))]), flush=True)
""").replace("NSAMPLES", str(SAMPLES))


def test_killed_download_leaves_no_truncated_shard(tmp_path, shards) -> None:
    root, _ = shards
    name = "shard-000005.tar"
    size = (root / name).stat().st_size
    seen = {}
    with ShardServer(root, stall={name}) as server:
        for label, extra in (("plain", {"SHAREDFS_DISABLE": "1"}), ("sharedfs", {})):
            cache = tmp_path / label
            cache.mkdir()
            server.reset()
            # Its own session: wids downloads with curl, which must die with it (a preempted job).
            proc = subprocess.Popen([sys.executable, "-c", GET, str(cache), server.url(name)], env=_env(**extra),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
            try:
                wait_until(lambda c=cache, p=proc: p.poll() is not None or _bytes_written(c) >= size // 2, timeout=60)
                assert proc.poll() is None, f"{label} reader exited early:\n{proc.stderr.read().decode()}"
                assert _bytes_written(cache) >= size // 2, f"{label}: download never started: {_listing(cache)}"
            finally:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            seen[label] = sorted(p.name for p in cache.iterdir())  # sharedfs keeps nothing in the cache
        server.stall.clear()
        after = {label: subprocess.run([sys.executable, "-c", GET, str(tmp_path / label), server.url(name)],
                                       check=False, env=_env(**extra), capture_output=True, text=True, timeout=60)
                 for label, extra in (("plain", {"SHAREDFS_DISABLE": "1"}), ("sharedfs", {}))}
    # Plain wids: the half-written shard sits under its final name and the next reader trusts it.
    assert name in seen["plain"] and (tmp_path / "plain" / name).stat().st_size < size
    assert after["plain"].returncode != 0 or after["plain"].stdout.strip().splitlines()[-1] != str(SAMPLES)
    # sharedfs: nothing visible, and the next reader fetches the shard cleanly and removes the partial.
    assert seen["sharedfs"] == []
    fixed = after["sharedfs"]
    assert fixed.returncode == 0 and fixed.stdout.strip().splitlines()[-1] == str(SAMPLES), fixed.stderr
    assert (tmp_path / "sharedfs" / name).read_bytes() == (root / name).read_bytes()
    assert list((_coordination(tmp_path / "sharedfs") / "tmp").iterdir()) == []


def _coordination(cache: Path) -> Path:
    """Where sharedfs keeps the cache's locks, claims, markers and partial downloads: beside it."""
    return cache.parent / f".{cache.name}.sharedfs"


def _listing(cache: Path) -> list[str]:
    return sorted(str(p.relative_to(cache)) for p in cache.rglob("*"))


def _bytes_written(cache: Path) -> int:
    total = 0
    for path in [*cache.glob("*.tar"), *(_coordination(cache) / "tmp").glob("*/*")]:
        try:
            total = max(total, path.stat().st_size)
        except FileNotFoundError:
            pass
    return total


# wids' own cleanup (what create_cleanup_background_process runs), looping while readers read.
CLEANER = textwrap.dedent("""
    import os, sys, time
    from wids.wids_cleanup import keep_most_recent_files
    cache, done, readers = sys.argv[1], sys.argv[2], int(sys.argv[3])
    deadline = time.time() + 90
    while time.time() < deadline and len(os.listdir(done)) < readers:
        keep_most_recent_files(os.path.join(cache, "*"), maxsize=1, maxfiles=1)
        time.sleep(0.005)
""")


def test_cleanup_never_deletes_a_shard_being_read(tmp_path, shards) -> None:
    root, expected = shards
    outcomes = {}
    # Each download stays half-written for 50 ms, as a real transfer does for a while.
    with ShardServer(root, midway=0.05) as server:
        for label, extra in (("plain", {"SHAREDFS_DISABLE": "1"}), ("sharedfs", {})):
            cache, done = tmp_path / label, tmp_path / f"{label}-done"
            cache.mkdir()
            done.mkdir()
            env = _env(T_URLS=json.dumps(server.urls(server.shard_names())), T_CACHE=cache, T_LRU=1, T_SHUFFLE=0,
                       **extra)
            cleaner = subprocess.Popen([sys.executable, "-c", CLEANER, str(cache), str(done), "2"], env=env,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            try:
                code = READER + f"\nopen(os.path.join({str(done)!r}, str(os.getpid())), 'w').close()\n"
                outcomes[label] = run_on_nodes([sys.executable, "-c", code], {"node": 2}, env=env, timeout=120)
            finally:
                for _ in range(2):  # readers that crashed never announce: release the cleaner anyway
                    (done / f"x{_}").touch()
                cleaner.wait(timeout=60)
    failures = [r.stderr.strip().splitlines()[-1] for r in outcomes["plain"] if r.returncode != 0]
    print("plain wids readers failed with:", failures)
    assert failures, "plain wids cleanup should have deleted a shard a reader was opening"
    assert_all_ok(outcomes["sharedfs"])
    assert all(_last_json(r.stdout) == expected for r in outcomes["sharedfs"])


CAP = textwrap.dedent("""
    import json, os, sys
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[0], cpus[-1]})
    if sys.argv[3] == "torch first":  # DataLoader imported (and bound) before wids loads sharedfs
        from torch.utils.data import DataLoader
    import wids
    from torch.utils.data import DataLoader
    ds = wids.ShardListDataset([{"url": sys.argv[1], "nsamples": 20}], cache_dir=sys.argv[2], transformations=[])
    print(json.dumps(DataLoader(ds, num_workers=16).num_workers))
""")


@pytest.mark.parametrize("order", ["wids first", "torch first"])
@pytest.mark.parametrize(("extra", "expected"), [({"SHAREDFS_DISABLE": "wids"}, 16), ({}, 2)])
def test_worker_cap_over_a_wids_dataset(tmp_path, shards, extra: dict, expected: int, order: str) -> None:
    root, _ = shards
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs at least 2 CPUs to limit the affinity to 2")
    proc = subprocess.run([sys.executable, "-c", CAP, str(root / "shard-000000.tar"), str(tmp_path), order],
                          check=False,
                          env=_env(**extra), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == expected
    logged = "num_workers=16 asked, 2 used: CPU affinity allows 2 CPU(s)" in proc.stderr
    assert logged == (expected == 2), proc.stderr


PLACE = textwrap.dedent("""
    import json
    import wids, wids.wids as core, wids.wids_dl as dl
    from torch.utils.data import DataLoader
    import sharedfs
    from sharedfs.startup import activation
    shards = [{"url": "http://127.0.0.1:9/x.tar", "nsamples": 1}]
    state = activation.shim_states()["wids"]
    before = [wids.ShardListDataset(shards, transformations=[]).cache_dir, dl.ULockFile.__name__,
              core.download_and_open is dl.download_and_open, state.installed_version, state.supported]
    sharedfs.disable()
    after = [wids.ShardListDataset(shards, transformations=[]).cache_dir, dl.ULockFile.__name__,
             core.download_and_open.__module__, hasattr(DataLoader.__init__, "__wrapped__")]
    print(json.dumps([before, after]))
""")


def _wids_release() -> str:
    """What the shim's version gate reads: the wids distribution, or the webdataset 0.2.x that bundles wids."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("wids")
    except PackageNotFoundError:
        return version("webdataset")


def test_node_local_placement_version_gate_and_unpatch(tmp_path) -> None:
    proc = subprocess.run([sys.executable, "-c", PLACE], check=False, capture_output=True, text=True, timeout=120,
                          env=_env(SHAREDFS_CACHE="node-local", SHAREDFS_CACHE_ROOT=tmp_path, SHAREDFS_LOG="info"))
    assert proc.returncode == 0, proc.stderr
    before, after = _last_json(proc.stdout)
    placed = str(tmp_path / f"sharedfs-{os.getuid()}" / "nojob" / "wids")
    # Plain wids' default is the predictable /tmp/_wids_cache, shared by every user of the node.
    assert before == [placed, "SharedFSLockFile", True, _wids_release(), True]
    assert after == ["/tmp/_wids_cache", "ULockFile", "wids.wids_dl", False]
    assert f"wids cache -> {placed}" in proc.stderr

"""Team caches (issue 17): one Hugging Face / WebDataset cache shared by a group of real Unix users.

A lab makes one ``HF_HOME`` for everyone: a directory owned by root and the lab's
group, setgid and group-writable (2775), so that each dataset, model and shard is
downloaded once.  Two throwaway users in a throwaway group (``group_of_users``)
use it with the default umask 022, each running one job that loads two local
JSON datasets and maps them (``datasets``), downloads two files from a local hub
(``huggingface_hub``, ``HF_ENDPOINT``), and reads shards over HTTP through a
WebDataset cache and a wids cache.

Without sharedfs (``SHAREDFS_DISABLE=1``) the first member's job works and the
second member's fails in every framework: the first one's lock files are 0644 and
every directory her frameworks made is 2755 (datasets#7900, datasets#6589,
datasets#2065).  With sharedfs every step of both works, nothing is downloaded
or computed twice, and everything the members' programs made in the caches is
the group's (dirs g+rwxs, files g+rw); a file the same jobs write outside the
caches keeps the umask's 0644.  Under umask 002 the stock frameworks already
work, and so must they with sharedfs (it used to make 0644 lock files there).

The lock layer across users: a lock file another user left 0644 is still taken
(flock read-only, existence locks), a lock file that cannot be created fails at
once instead of waiting forever, and a dead member's marker is broken where the
directory allows it and named, with the command, where it does not (sticky).
``sharedfs doctor`` finds what keeps members out and prints the one-time fix,
which then makes even the stock frameworks work.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import require
from helpers.shardcache_support import User, group_of_users, scratch
from test_huggingface_hub import FakeHub

from sharedfs.demo.shardserver import ShardServer, make_shards

require("datasets", "needs datasets (scripts/requirements-test.txt)")
require("webdataset", "needs webdataset==1.0.2 (scripts/requirements-test.txt)")
require("wids", "needs wids==0.1.11 (scripts/requirements-test.txt)")

# xdist_group: the module's throwaway users and the plans run once under them.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("test_team_cache")]

# One member's job: each step in order, its outcome recorded (a failing step does not hide the next
# one); the outcomes as JSON on the last line.  Steps: datasets:<X|Y>[*k[/n]] loads a JSON dataset (and
# maps x -> x*k, in n worker processes), hub:<file> downloads from the local hub, webdataset:/wids:<i+j> read those shards
# through the cache, outside:<path> writes a file outside every cache.
JOB = textwrap.dedent("""
    import hashlib, json, os, sys
    outcomes = {}
    for step in sys.argv[1].split(","):
        framework, _, arg = step.partition(":")
        try:
            if framework == "datasets":
                import datasets
                datasets.disable_progress_bars()
                name, _, k = arg.partition("*")
                k, _, procs = k.partition("/")
                ds = datasets.load_dataset("json", data_files=os.environ["T_DATA_" + name], split="train")
                if k:
                    ds = ds.map(lambda row, k=int(k): {"y": row["x"] * k}, num_proc=int(procs) if procs else None)
                result = sum(ds["y" if k else "x"])
            elif framework == "hub":
                from huggingface_hub import hf_hub_download
                with open(hf_hub_download("org/tiny", arg), "rb") as fh:
                    result = hashlib.sha256(fh.read()).hexdigest()[:12]
            elif framework == "webdataset":
                import webdataset as wds
                os.makedirs(os.environ["T_WDS"], exist_ok=True)  # webdataset wants it to exist
                urls = [os.environ["T_SHARDS"] + f"/shard-{int(i):06d}.tar" for i in arg.split("+")]
                result = sum(1 for _ in wds.WebDataset(urls, cache_dir=os.environ["T_WDS"], shardshuffle=False,
                                                       empty_check=False))
            elif framework == "wids":
                import wids
                urls = [os.environ["T_SHARDS"] + f"/shard-{int(i):06d}.tar" for i in arg.split("+")]
                ds = wids.ShardListDataset([{"url": u, "nsamples": 5} for u in urls], cache_dir=os.environ["T_WIDS"])
                result = len({ds[i]["__key__"] for i in range(len(ds))})
            elif framework == "outside":
                with open(arg, "w") as fh:
                    fh.write("notes")
                result = oct(os.stat(arg).st_mode & 0o7777)
            outcomes[step] = f"ok {result}"
        except Exception as exc:
            outcomes[step] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(outcomes))
""")

# The first member fills the caches; the second reuses all of it and adds to every cache
# (a map of X the first did not compute, a new dataset, a new blob, new shards); the first
# then reuses what the second added.  wids reads shards 3-5, webdataset 0-2: one GET each.
PLAN = (
    ("a", "datasets:X*2,hub:config.json,webdataset:0+1,wids:3+4"),
    ("b", "datasets:X*2,datasets:X*3/2,datasets:Y*2,hub:config.json,hub:weights.bin,webdataset:0+1+2,wids:3+4+5"),
    ("a", "datasets:Y*3,hub:weights.bin,webdataset:2,wids:5,outside:{team}/notes-a.txt"),
)
# json-train.arrow of X and Y, one map result each for X*2, Y*2, Y*3, and two for X*3 (num_proc=2: one per worker)
DATASET_FILES = 7


@dataclass(frozen=True)
class Entry:
    path: str  # relative to the team directory
    owner: str  # "a", "b" or another name
    gid: int
    mode: int
    kind: str  # "dir", "file", "link"


@dataclass(frozen=True)
class Run:
    """What one plan did in one team directory: each job's outcomes, and what it left there."""

    team: Path
    plan: tuple[tuple[str, str], ...]
    outcomes: list[dict[str, str]]
    entries: list[Entry]
    shard_gets: dict[str, int]
    hub_gets: int

    def failures(self, member: str) -> dict[str, str]:
        jobs = [out for (who, _), out in zip(self.plan, self.outcomes) if who == member]
        return {step: text for job in jobs for step, text in job.items() if not text.startswith("ok")}

    def files(self, under: str, suffix: str = "") -> list[Entry]:
        return [e for e in self.entries if e.kind == "file" and e.path.startswith(under + "/")
                and e.path.endswith(suffix) and "/." not in "/" + e.path]


@dataclass(frozen=True)
class Site:
    root: Path
    a: User
    b: User
    hub: FakeHub
    shards: ShardServer

    @property
    def gid(self) -> int:
        return self.a.group

    def users(self) -> dict[str, User]:
        return {"a": self.a, "b": self.b}


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    """Two members of one throwaway group, a local hub and a shard server; all removed afterwards."""
    hub = FakeHub()
    thread = threading.Thread(target=hub.serve_forever, daemon=True)
    thread.start()
    try:
        with scratch("sharedfs-team-") as root, group_of_users(2, root) as (a, b):
            make_shards(root / "src", count=6, samples=5)
            for n, name in enumerate("XY"):
                (root / f"{name}.json").write_text("".join(json.dumps({"x": i + n}) + "\n" for i in range(10)))
            for path in (root / "src", *(root / "src").iterdir(), *root.glob("*.json")):
                path.chmod(0o755 if path.is_dir() else 0o644)
            with ShardServer(root / "src") as shards:
                yield Site(root, a, b, hub, shards)
    finally:
        hub.release.set()
        hub.shutdown()
        hub.server_close()


def team_dir(site: Site, label: str, mode: int = 0o2775) -> Path:
    """The lab's directory: root-owned, the group's, ``mode`` (2775: setgid, group-writable)."""
    team = site.root / label
    team.mkdir()
    os.chown(team, 0, site.gid)
    team.chmod(mode)
    return team


def job_env(site: Site, team: Path, *, sharedfs: bool, **extra: str) -> dict[str, str]:
    env = {"HF_HOME": str(team), "HF_DATASETS_OFFLINE": "1", "HF_ENDPOINT": site.hub.endpoint,
           "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_XET": "1",
           "T_SHARDS": f"http://127.0.0.1:{site.shards.port}", "T_WDS": str(team / "wds"),
           "T_WIDS": str(team / "wids"), "T_DATA_X": str(site.root / "X.json"), "T_DATA_Y": str(site.root / "Y.json"),
           **extra}
    if not sharedfs:
        env["SHAREDFS_DISABLE"] = "1"
    return env


def run_plan(site: Site, label: str, *, umask: int, sharedfs: bool, plan: tuple[tuple[str, str], ...] = PLAN) -> Run:
    team = team_dir(site, label)
    site.shards.reset()
    hub_before = len(site.hub.gets)
    outcomes = []
    for who, steps in plan:
        proc = site.users()[who].run([sys.executable, "-c", JOB, steps.format(team=team)],
                                     env=job_env(site, team, sharedfs=sharedfs), umask=umask, timeout=240)
        assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr[-3000:]
        outcomes.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return Run(team, plan, outcomes, listing(site, team), site.shards.counts(), len(site.hub.gets) - hub_before)


def listing(site: Site, top: Path) -> list[Entry]:
    names = {site.a.uid: "a", site.b.uid: "b"}
    found = []
    for dirpath, dirnames, filenames in os.walk(top):
        for name in (*dirnames, *filenames):
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            kind = "link" if stat.S_ISLNK(st.st_mode) else "dir" if stat.S_ISDIR(st.st_mode) else "file"
            found.append(Entry(os.path.relpath(path, top), names.get(st.st_uid, str(st.st_uid)), st.st_gid,
                               stat.S_IMODE(st.st_mode), kind))
    return found


def keeps_members_out(entry: Entry, gid: int) -> bool:
    """Whether another member of the group could not read, lock or add to this entry as a cache needs."""
    if entry.kind == "link":
        return False
    if entry.gid != gid:
        return True
    need = stat.S_IRWXG | stat.S_ISGID if entry.kind == "dir" else stat.S_IRGRP | stat.S_IWGRP
    return entry.mode & need != need


@pytest.fixture(scope="module")
def umask022(site: Site) -> dict[str, Run]:
    """The plan under the default umask 022: stock frameworks, then the same with sharedfs."""
    return {"stock": run_plan(site, "stock-022", umask=0o022, sharedfs=False),
            "sharedfs": run_plan(site, "sharedfs-022", umask=0o022, sharedfs=True)}


# -- the four frameworks under umask 022 ------------------------------------------------------------


def test_datasets_second_member_fails_stock_and_shares_the_cache_with_sharedfs(umask022) -> None:
    stock, fixed = umask022["stock"], umask022["sharedfs"]
    assert not stock.failures("a")
    failed = {step: text for step, text in stock.failures("b").items() if step.startswith("datasets")}
    assert list(failed) == ["datasets:X*2", "datasets:X*3/2", "datasets:Y*2"]
    # datasets#7900: the first member's lock file is 0644 and filelock opens it for writing.
    assert all(text.startswith("PermissionError: [Errno 13] Permission denied") and text.endswith(".lock'")
               for text in failed.values()), failed

    assert not fixed.failures("a") and not fixed.failures("b")
    # The same answers for both members, and each Arrow file exactly once: nothing was prepared or mapped twice.
    assert fixed.outcomes[1]["datasets:X*2"] == fixed.outcomes[0]["datasets:X*2"] == "ok 90"
    arrows = fixed.files("datasets", ".arrow")
    assert len(arrows) == DATASET_FILES, arrows
    assert {e.owner for e in arrows} == {"a", "b"}


def test_hub_second_member_fails_stock_and_shares_the_cache_with_sharedfs(umask022) -> None:
    stock, fixed = umask022["stock"], umask022["sharedfs"]
    # The hub makes its lock files 0o664 (huggingface_hub#2580), but .locks/<repo>/ is the first member's 2755.
    failed = stock.failures("b")
    assert "hub:config.json" not in failed  # a cache hit needs no write
    assert failed["hub:weights.bin"].startswith("PermissionError: [Errno 13] Permission denied")
    assert "/hub/.locks/models--org--tiny/" in failed["hub:weights.bin"]

    assert not fixed.failures("a") and not fixed.failures("b")
    assert fixed.hub_gets == 2  # config.json and weights.bin, once each for the whole group
    blobs = fixed.files("hub/models--org--tiny/blobs")
    assert sorted(e.owner for e in blobs) == ["a", "b"]


def test_webdataset_second_member_fails_stock_and_shares_the_cache_with_sharedfs(umask022) -> None:
    stock, fixed = umask022["stock"], umask022["sharedfs"]
    failed = stock.failures("b")["webdataset:0+1+2"]
    # webdataset downloads to <shard>.temp<pid> in the cache the first member made 2755.
    assert failed.startswith("PermissionError: [Errno 13] Permission denied") and "/wds/shard-000002.tar.temp" in failed

    assert not fixed.failures("a") and not fixed.failures("b")
    assert fixed.outcomes[1]["webdataset:0+1+2"] == "ok 15"
    assert sorted(e.path for e in fixed.files("wds")) == [f"wds/shard-00000{i}.tar" for i in range(3)]
    assert {name: n for name, n in fixed.shard_gets.items() if name < "shard-000003"} == {
        f"shard-00000{i}.tar": 1 for i in range(3)}


def test_wids_second_member_fails_stock_and_shares_the_cache_with_sharedfs(umask022) -> None:
    stock, fixed = umask022["stock"], umask022["sharedfs"]
    failed = stock.failures("b")["wids:3+4+5"]
    # wids' ULockFile opens <shard>.lock for writing in the cache the first member made 2755.
    assert failed.startswith("PermissionError: [Errno 13] Permission denied") and "/wids/shard-000003.tar.lock" in failed

    assert not fixed.failures("a") and not fixed.failures("b")
    assert fixed.outcomes[1]["wids:3+4+5"] == "ok 15"
    assert sorted(e.path for e in fixed.files("wids")) == [f"wids/shard-00000{i}.tar" for i in (3, 4, 5)]
    assert {name: n for name, n in fixed.shard_gets.items() if name >= "shard-000003"} == {
        f"shard-00000{i}.tar": 1 for i in (3, 4, 5)}


def test_what_members_made_is_the_groups_inside_the_caches_and_nothing_is_widened_outside(umask022, site) -> None:
    stock, fixed = umask022["stock"], umask022["sharedfs"]
    made = [e for e in fixed.entries if e.owner in ("a", "b") and not e.path.startswith("notes-")]
    assert len(made) > 60  # datasets, hub, both shard caches and the shard cache's coordination tree
    assert [e for e in made if keeps_members_out(e, site.gid)] == []
    # Group bits only: nothing a member made became writable by others.
    assert [e for e in made if e.kind != "link" and e.mode & stat.S_IWOTH] == []
    # Stock, the same jobs left most of the tree closed to the other member.
    closed = [e for e in stock.entries if e.owner in ("a", "b") and keeps_members_out(e, site.gid)]
    assert len(closed) > 20, closed
    # A file the job wrote in the lab's directory, outside every cache, keeps the umask's mode.
    assert fixed.outcomes[2][f"outside:{fixed.team}/notes-a.txt"] == "ok 0o644"
    (notes,) = [e for e in fixed.entries if e.path == "notes-a.txt"]
    assert notes.mode == 0o644


def test_umask_002_works_stock_and_with_sharedfs(site) -> None:
    """Where the stock frameworks already work (umask 002), sharedfs must not break them (0644 lock files did)."""
    plan = PLAN[:2]
    stock = run_plan(site, "stock-002", umask=0o002, sharedfs=False, plan=plan)
    fixed = run_plan(site, "sharedfs-002", umask=0o002, sharedfs=True, plan=plan)
    for run in (stock, fixed):
        assert not run.failures("a") and not run.failures("b")
        locks = [e for e in run.entries if e.kind == "file" and e.path.endswith(".lock")]
        assert locks and all(e.mode & 0o060 == 0o060 for e in locks), locks
        assert len(run.files("datasets", ".arrow")) == DATASET_FILES - 1  # all but Y*3 (the third job's)
    assert fixed.hub_gets == stock.hub_gets == 2


# A dataset prepared from a generator; with T_DIE the job is SIGKILLed half-way (Slurm's time limit, the
# OOM killer), leaving the builder's <output>.incomplete directory and its half-written Arrow file behind.
PREPARE = textwrap.dedent("""
    import os, signal, time
    import datasets
    datasets.disable_progress_bars()

    def rows():
        for i in range(40):
            if i == 20 and os.environ.get("T_DIE"):
                time.sleep(2.5)  # preparing for a while (real preparations take minutes) ...
                os.kill(os.getpid(), signal.SIGKILL)  # ... then killed
            yield {"x": i}

    print(len(datasets.Dataset.from_generator(rows)))
""")


def test_a_member_killed_while_preparing_leaves_the_dataset_preparable_by_the_next(site: Site) -> None:
    """What she made before she was killed is the group's: no lock release, no exit handler ran."""
    results = {}
    for mode in ("stock", "sharedfs"):
        team = team_dir(site, f"killed-{mode}")
        env = job_env(site, team, sharedfs=mode == "sharedfs")
        killed = site.a.run([sys.executable, "-c", PREPARE], env={**env, "T_DIE": "1"}, umask=0o022)
        assert killed.returncode == -9, killed.stderr[-2000:]
        partial = [e for e in listing(site, team) if ".incomplete" in e.path]
        assert partial, "the killed job left no partial preparation"
        results[mode] = (partial, site.b.run([sys.executable, "-c", PREPARE], env=env, umask=0o022))
    partial, stock = results["stock"]
    assert stock.returncode != 0 and "PermissionError: [Errno 13] Permission denied" in stock.stderr
    assert all(keeps_members_out(e, site.gid) for e in partial)
    partial, fixed = results["sharedfs"]
    assert fixed.returncode == 0 and fixed.stdout.split() == ["40"], fixed.stderr[-3000:]
    assert not [e for e in partial if keeps_members_out(e, site.gid)]


# -- locks across members -----------------------------------------------------------------------------

# Hold a lock until killed: sharedfs's (kind given); with "stock", filelock's own FileLock; with
# "raw", a bare flock on whatever file the path names (no ownership check), at once or an error.
HOLD = textwrap.dedent("""
    import sys, time
    path, kind = sys.argv[1:3]
    if kind == "raw":
        import fcntl, os
        fcntl.flock(os.open(path, os.O_RDWR | os.O_CREAT, 0o666), fcntl.LOCK_EX | fcntl.LOCK_NB)
    elif kind == "stock":
        import filelock
        held = filelock.FileLock(path)  # kept referenced: a collected lock releases itself
        held.acquire()
    else:
        import sharedfs
        held = sharedfs.lock(path, kind=kind, timeout=10)
        held.acquire()
    print("held", flush=True)
    time.sleep(600)
""")

# Try to take a lock (sharedfs's, or with "stock" filelock's FileLock); one JSON line: what happened and after how long.
TAKE = textwrap.dedent("""
    import json, sys, time
    import filelock, sharedfs
    path, kind, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
    started = time.monotonic()
    try:
        with filelock.FileLock(path, timeout=timeout) if kind == "stock" else sharedfs.lock(path, kind=kind,
                                                                                          timeout=timeout):
            outcome = "took"
    except sharedfs.LockTimeout as exc:
        outcome = f"LockTimeout: {exc}"
    except OSError as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    print(json.dumps({"outcome": outcome, "after": round(time.monotonic() - started, 1)}))
""")


def hold(user: User, path: Path, kind: str, *, umask: int = 0o022, env: dict[str, str] | None = None):
    """Start ``user`` holding the lock ``path``; returns the process once it holds it."""
    proc = user.popen([sys.executable, "-c", HOLD, str(path), kind], umask=umask, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != "held":
        proc.kill()
        raise AssertionError(f"the holder never held {path}: {line}{proc.communicate()[1][-2000:]}")
    return proc


def kill(proc: subprocess.Popen[str]) -> None:
    os.killpg(proc.pid, 9)
    proc.communicate()


def take(user: User, path: Path, kind: str, timeout: float) -> tuple[dict, str]:
    proc = user.run([sys.executable, "-c", TAKE, str(path), kind, str(timeout)], umask=0o022,
                    env={"SHAREDFS_LOG": "info", "SHAREDFS_NODE_ID": "node1"}, timeout=timeout + 60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_a_lock_file_another_member_left_0644_is_still_taken(site: Site) -> None:
    team = team_dir(site, "locks-0644")
    lock = team / "job.lock"
    holder = hold(site.a, lock, "stock", env={"SHAREDFS_DISABLE": "1"})  # plain filelock, umask 022: 0644
    try:
        assert stat.S_IMODE(lock.stat().st_mode) == 0o644 and lock.stat().st_uid == site.a.uid
        # flock on a descriptor opened read-only: excluded by the stock holder, never an error.
        waited, _ = take(site.b, lock, "flock", 2)
        assert waited["outcome"].startswith("LockTimeout") and waited["after"] >= 2, waited
    finally:
        kill(holder)
    took, _ = take(site.b, lock, "flock", 10)
    assert took["outcome"] == "took", took
    # An existence lock needs only the directory's write bit.
    took, _ = take(site.b, lock, "soft", 10)
    assert took["outcome"] == "took", took
    # An exclusive POSIX record lock needs a descriptor opened for writing; on the read-only one a
    # shared lock (excluded by every exclusive holder) plus the marker (excludes other readers) is taken.
    took, _ = take(site.b, lock, "posix", 10)
    assert took["outcome"] == "took", took
    # Nobody chmod-ed or replaced the other member's file to get in.
    assert stat.S_IMODE(lock.stat().st_mode) == 0o644 and lock.stat().st_uid == site.a.uid


def test_a_lock_file_that_cannot_be_created_fails_at_once_instead_of_waiting_forever(site: Site) -> None:
    """A directory another member made 2755: no lock file, and no way to create one (sharedfs waited forever)."""
    team = team_dir(site, "locks-closed")
    closed = team / "made-by-a"
    site.a.run(["mkdir", str(closed)], umask=0o022)
    assert stat.S_IMODE(closed.stat().st_mode) == 0o2755
    for kind in ("flock", "posix"):
        refused, _ = take(site.b, closed / f"{kind}.lock", kind, 30)
        assert refused["outcome"].startswith("PermissionError: [Errno 13] Permission denied"), refused
        assert refused["after"] < 5
    assert f"owned by {site.a.name}" in refused["outcome"] and "chmod g+ws" in refused["outcome"]


def test_a_lock_file_another_user_may_remove_from_a_sticky_directory_is_refused(site: Site) -> None:
    """In a sticky, world-writable directory (``/tmp``) a lock file of a third user is hers to remove.

    She creates it first; the victim's job locks it; she removes it mid-hold; the victim's
    next process creates a new file of that name, locks it too, and two hold the lock.
    filelock refuses such a file since 4.2.12; sharedfs took it (read-write, or read-only
    where ``fs.protected_regular`` refuses ``O_CREAT``) and now refuses it at once.
    """
    tmp = site.root / "tmp-like"
    tmp.mkdir()
    tmp.chmod(0o1777)  # root's, sticky, world-writable: /tmp
    lock = tmp / "job.lock"
    site.a.run(["touch", str(lock)], umask=0o000)  # hers, 0666: anyone may open it for writing
    assert lock.stat().st_uid == site.a.uid and stat.S_IMODE(lock.stat().st_mode) == 0o666

    # The attack, against a lock that takes any file it can open: it works.
    first = hold(site.b, lock, "raw")
    try:
        assert site.a.run(["rm", "-f", str(lock)]).returncode == 0  # hers to remove, held or not
        second = hold(site.b, lock, "raw")  # a new file, locked at once: two holders
        kill(second)
    finally:
        kill(first)
    assert lock.stat().st_uid == site.b.uid
    lock.unlink()

    site.a.run(["touch", str(lock)], umask=0o000)
    for kind in ("flock", "posix"):
        refused, _ = take(site.b, lock, kind, 30)
        assert refused["outcome"].startswith("PermissionError: [Errno 13] Permission denied: the lock file belongs "
                                             f"to {site.a.name} (uid {site.a.uid})"), refused
        assert f"{tmp} is sticky" in refused["outcome"] and f"run: rm -f {lock}" in refused["outcome"], refused
        assert refused["after"] < 5, refused
    # filelock's own FileLock refuses it too since 4.2.12 (before, it took it, as sharedfs did).
    import filelock
    from packaging.version import Version

    stock, _ = take(site.b, lock, "stock", 5)
    refuses = Version(filelock.__version__) >= Version("4.2.12")
    assert stock["outcome"].startswith("PermissionError: [Errno 13]" if refuses else "took"), stock

    # A lock file of the victim's own, and one of the directory's owner, cannot be removed by her: taken.
    (tmp / "roots.lock").touch()
    (tmp / "roots.lock").chmod(0o666)
    for name in ("own.lock", "roots.lock"):
        took, _ = take(site.b, tmp / name, "flock", 10)
        assert took["outcome"] == "took", (name, took)


def test_a_dead_members_marker_is_broken_where_the_directory_allows_it(site: Site) -> None:
    """Her job was killed holding an existence lock; the next member's job takes it over.

    Under umask 077 her marker would be 0600 and nobody could read who held it: in a
    directory that is no team cache the next member waits it out.  In the team cache sharedfs
    made the marker the group's, so its record says the holder is gone, and the directory
    (group-writable, not sticky) lets another member remove it.
    """
    plain = team_dir(site, "stale-plain", mode=0o0775)  # group-writable, but no setgid: no team cache
    team = team_dir(site, "stale-team")
    for where in (plain, team):
        kill(hold(site.a, where / "job.lock", "soft", umask=0o077, env={"SHAREDFS_NODE_ID": "node1"}))
    waited, said = take(site.b, plain / "job.lock", "soft", 3)
    assert waited["outcome"].startswith("LockTimeout"), waited
    assert "is not a lock marker sharedfs wrote" in said
    assert stat.S_IMODE((plain / "job.lock.held").stat().st_mode) == 0o600

    marker = team / "job.lock.held"
    assert stat.S_IMODE(marker.stat().st_mode) & 0o060 == 0o060 and marker.stat().st_gid == site.gid
    took, said = take(site.b, team / "job.lock", "soft", 30)
    assert took["outcome"] == "took", (took, said)
    assert "broke the lock" in said and "is gone" in said


def test_a_dead_members_marker_in_a_sticky_directory_is_named_with_its_owner_and_the_command(site: Site) -> None:
    team = team_dir(site, "stale-sticky", mode=0o3775)  # setgid, group-writable, sticky: only owners may remove
    kill(hold(site.a, team / "job.lock", "soft", env={"SHAREDFS_NODE_ID": "node1"}))
    marker = team / "job.lock.held"
    waited, said = take(site.b, team / "job.lock", "soft", 3)
    assert waited["outcome"].startswith("LockTimeout"), waited
    assert f"{marker} was left by {site.a.name} (uid {site.a.uid}), whose process is gone" in said, said
    assert "does not let you remove another user's file" in said and f"run: rm -f {marker}" in said
    assert marker.exists() and marker.stat().st_uid == site.a.uid  # refused, not removed
    command = said.split("run: ", 1)[1].split("\n", 1)[0]
    subprocess.run(shlex.split(command), check=True)  # what the administrator runs
    took, _ = take(site.b, team / "job.lock", "soft", 10)
    assert took["outcome"] == "took", took


# -- sharedfs doctor on a team cache ----------------------------------------------------------------------


def doctor(user: User, path: Path) -> tuple[dict, str]:
    as_json = user.run([sys.executable, "-m", "sharedfs", "doctor", "--json", str(path)], env={}, timeout=120)
    text = user.run([sys.executable, "-m", "sharedfs", "doctor", str(path)], env={}, timeout=120)
    assert as_json.returncode == 0 and text.returncode == 0, as_json.stderr + text.stderr
    return json.loads(as_json.stdout)["paths"][0]["team"], text.stdout


def test_doctor_names_what_keeps_members_out_and_its_one_time_fix_works(umask022, site: Site) -> None:
    import grp

    team_group = grp.getgrgid(site.gid).gr_name

    healthy, text = doctor(site.b, umask022["sharedfs"].team)
    assert healthy["team"] and healthy["group"] == team_group and sum(healthy["problems"].values()) == 0, healthy
    assert "every member can read, lock and add to them" in text

    stock = umask022["stock"].team
    report, text = doctor(site.b, stock)
    assert report["team"] and report["problems"]["closed_dirs"] > 5 and report["problems"]["unlockable"] >= 1
    assert any(e["owner"] == site.a.name and e["mode"] == "2755" for e in report["examples"]["closed_dirs"])
    assert report["fix"] == [f"chmod -R g+rwX {stock}", f"setfacl -R -d -m g:{team_group}:rwX {stock}"]
    assert "  team fix   : run as root, or each owner on her own entries:" in text

    for command in report["fix"]:  # the administrator's one-time fix ...
        subprocess.run(shlex.split(command), check=True)
    after, _ = doctor(site.b, stock)
    assert sum(after["problems"].values()) == 0 and after["default_acl_group"] == team_group, after
    # ... after which even the stock frameworks work for the second member, under umask 022.
    steps = "datasets:X*3/2,datasets:Y*2,hub:weights.bin,webdataset:0+1+2,wids:3+4+5"
    proc = site.b.run([sys.executable, "-c", JOB, steps], env=job_env(site, stock, sharedfs=False), umask=0o022)
    assert proc.returncode == 0, proc.stderr[-3000:]
    outcomes = json.loads(proc.stdout.strip().splitlines()[-1])
    assert all(text.startswith("ok") for text in outcomes.values()), outcomes


def test_doctor_says_when_people_share_a_directory_that_is_no_team_cache(site: Site) -> None:
    shared = team_dir(site, "shared-not-team", mode=0o0775)
    for user in (site.a, site.b):
        user.run(["touch", str(shared / f"from-{user.name}")], umask=0o022)
    report, text = doctor(site.a, shared)
    assert not report["team"] and report["shared"] and set(report["owners"]) == {site.a.name, site.b.name, "root"}
    assert "NOT a team cache" in text
    assert [command.split()[0:2] for command in report["fix"]] == [
        ["chgrp", "-R"], ["chmod", "-R"], ["find", shlex.quote(str(shared))], ["setfacl", "-R"]]

"""What the next holder sees when it is not root: the wait must not rest on files only root may read.

The next holder of a ``sharedfs.lock`` after one on another node waits out the longest metadata cache
timeout of the lock's mount (docs/api.md, "What the next holder sees").  The timeouts are the
client's own options, which mountinfo never shows: JuiceFS serves them in ``.config`` and MooseFS in
``.params`` at the mount's root, both readable by root only, and mfsmount rewrites its process title
to ``mfsmount (mounted on: ...)``.  JuiceFS's rewritten title keeps its options and any user can read
it, except where ``/proc`` is mounted ``hidepid=2`` (as on many shared cluster nodes; done here in a
private mount namespace) or the client runs in another PID namespace.  A cluster user is not root.

On a real volume with 3 s client caches (the ``lagging`` profile), a throwaway user takes turns with
itself on 2 nodes x 2 processes so that every increment of a counter, replaced by rename under the
lock, crosses nodes (the counter script of tests/integration/test_realfs_handover.py):

* sharedfs before this change (:data:`BEFORE`, extracted from git) as root reads the options: 0
  stale reads; as the user it falls back to the client's documented default (1 s) and the next
  holder reads the counter the last one replaced (stale reads, lost increments): shown first;
* with a site plugin declaring the mount's cache timeout (``FsInfo.cache_seconds``): 0 stale reads at
  the declared 3 s per cross-node handover;
* with nothing declared, this checkout fails closed: it waits the longest timeout the rule honours
  (``MAX_SETTLE``, 60 s) on a cross-node handover, and reads no stale value; a same-node handover
  still waits nothing;
* ``sharedfs status PATH`` and ``sharedfs doctor PATH`` say in one line where the wait came from.
"""

from __future__ import annotations

import errno
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import clean_env, unixusers
from helpers.shardcache_support import sharedfs_at
from test_realfs_handover import INCREMENTS, TURNS

import sharedfs
from sharedfs.demo import node_env
from sharedfs.demo.realfs import LAG_S, Volume
from sharedfs.locks._handover import MAX_SETTLE
from sharedfs.model.mounts import TITLE_CAP

# xdist_group: one real volume at a time, as the other real-filesystem tests.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("realfs")]

#: sharedfs before this change: the wait fell back to the client's documented default (1 s) where the
#: client's options could not be read.
BEFORE = "961ec2ceee4c5bb8081c9b93bdf2e3b4dcfa669e"
#: Applied to :data:`BEFORE` for the cross-node runs: a MooseFS client may answer a plain create with EEXIST
#: (a stale negative entry), which that code raised into the holder and this test is not about.
EEXIST_FIX = "c12e0c2a997b5011c2fd1d9e960c9020f3e00db9"
CHECKOUT = str(Path(sharedfs.__file__).resolve().parents[1])
SITE_PACKAGES = sysconfig.get_paths()["purelib"]
#: Increments of the fail-closed run: each cross-node one waits MAX_SETTLE.
ASSUMED_INCREMENTS = 3

#: What a user can read of the client's options, and what sharedfs makes of them.
PROBE = textwrap.dedent('''
    import errno, json, os, sys
    from sharedfs.locks import _handover
    from sharedfs.machinery import choices
    mount = sys.argv[1]
    fs = choices.filesystem(mount)
    seen = {"settle": _handover.settle_seconds(fs), "options": fs.mount.client_options, "titles": []}
    for name in (".config", ".params"):
        try:
            os.close(os.open(os.path.join(mount, name), os.O_RDONLY | os.O_NONBLOCK))
            seen[name] = "readable"
        except OSError as exc:
            seen[name] = errno.errorcode[exc.errno]
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                title = f.read(4096).replace(b"\\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if mount in title and os.path.basename(title.split(" ")[0]) in ("juicefs", "mfsmount"):
            seen["titles"].append(title)
    print(json.dumps(seen))
''')

#: A process of node ``argv[2]`` taking the lock at ``argv[1]`` once: how long its acquire took.
ONCE = textwrap.dedent('''
    import json, sys, time
    import sharedfs
    from sharedfs.locks import _handover
    lock = sharedfs.lock(sys.argv[1])
    start = time.monotonic()
    with lock:
        took = time.monotonic() - start
    print(json.dumps({"took": took, **_handover.stats}))
''')

#: A site that knows its mounts: their clients cache for at most 3 s.
SITE_PLUGIN = textwrap.dedent('''
    import os
    from sharedfs.types import FsInfo, Mount, hookimpl

    KINDS = {"fuse.juicefs": ("juicefs", "JuiceFS"), "fuse": ("moosefs", "MooseFS")}


    @hookimpl
    def sharedfs_classify_filesystem(mount: Mount) -> FsInfo | None:
        ours = os.environ.get("MYSITE_MOUNTS")
        if not ours or not mount.mount_point.startswith(ours + "/") or mount.fstype not in KINDS:
            return None
        kind, name = KINDS[mount.fstype]
        return FsInfo(mount=mount, kind=kind, shared=True, flock="coherent", posix="coherent", o_excl_atomic=True,
                      name=name, hard_links=True, cache_seconds=3.0,
                      notes=(f"{name}: our clients cache metadata for 3 s at most (site plugin).",))
''')


def _site(where: Path) -> str:
    """A site plugin (a module and its ``sharedfs`` entry point) in ``where``, for ``PYTHONPATH``."""
    where.mkdir()
    (where / "mysite_cachewait.py").write_text(SITE_PLUGIN)
    meta = where / "mysite_cachewait-1.0.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: mysite-cachewait\nVersion: 1.0\n")
    (meta / "entry_points.txt").write_text("[sharedfs]\nmysite_cachewait = mysite_cachewait\n")
    for path in (where, meta, *where.iterdir(), *meta.iterdir()):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return str(where)


class Runner:
    """Processes of a throwaway user (or root), on one machine whose ``/proc`` may hide other users' processes."""

    def __init__(self, user: unixusers.User | None, hidepid: bool) -> None:
        self.user, self.hidepid = user, hidepid

    def popen(self, argv: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
        ids: dict[str, object] = {}
        if self.user is not None and self.hidepid:
            # A private mount namespace whose /proc shows a user only her own processes, as hidepid=2 on a node.
            script = (f"mount -t proc -o hidepid=2 proc /proc && exec setpriv --reuid={self.user.uid} "
                      f'--regid={self.user.gid} --clear-groups -- "$@"')
            argv = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh", *argv]
        elif self.user is not None:
            ids = {"user": self.user.uid, "group": self.user.gid, "extra_groups": []}
        return subprocess.Popen(argv, env=env, cwd="/", text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True, **ids)  # type: ignore[call-overload]

    def run(self, argv: list[str], env: dict[str, str], timeout: float = 120) -> str:
        proc = self.popen(argv, env)
        out, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, err[-3000:]
        return out

    def json(self, argv: list[str], env: dict[str, str]) -> dict:
        return json.loads(self.run(argv, env).strip().splitlines()[-1])


def take_turns(vol: Volume, runner: Runner, env: dict[str, str], label: str, total: int, tmp_path: Path) -> dict:
    """2 nodes x 2 processes of ``runner``, ``total`` increments of a counter replaced by rename, each crossing
    nodes (the counter script of test_realfs_handover); the sums over processes."""
    dirs = [mount / label for mount in vol.mounts]
    dirs[0].mkdir()
    (dirs[0] / "counter").write_text("0")
    truth = tmp_path / "truths" / label
    truth.write_text("")
    if runner.user is not None:
        for path in (dirs[0], dirs[0] / "counter", truth):
            os.chown(path, runner.user.uid, runner.user.gid)
    time.sleep(LAG_S + 0.5)  # both nodes see the directory and the counter
    procs = [runner.popen([sys.executable, "-c", TURNS, "sharedfs", "rename", str(dirs[i % 2] / "counter.lock"),
                           str(dirs[i % 2] / "counter"), str(truth), str(total)], node_env("ab"[i % 2], env))
             for i in range(4)]
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=900)
            listing = subprocess.run(["ls", "-lan", *map(str, dirs)], capture_output=True, text=True).stdout
            assert proc.returncode == 0, f"{err[-3000:]}\n{listing}"
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    time.sleep(LAG_S + 0.5)  # this process's own view of the counter settles too
    handovers = [h for r in results for h in r["handovers"]]
    got = {"final": int((dirs[0] / "counter").read_text() or 0),
           **{key: sum(r[key] for r in results) for key in ("increments", "reads", "stale", "errors")},
           "median": statistics.median(handovers) if handovers else 0.0, "min": min(handovers, default=0.0),
           "max": max(handovers, default=0.0)}
    print(f"{vol.kind} {label}: counter {got['final']}/{total}, {got['stale']} of {got['reads']} reads stale "
          f"({got['errors']} failed), cross-node handover median {got['median']:.1f} s (min {got['min']:.1f} s, "
          f"max {got['max']:.1f} s)")
    return got


def _line(text: str, prefix: str = "  handover   : ") -> str:
    found = [line[len(prefix):] for line in text.splitlines() if line.startswith(prefix)]
    assert len(found) == 1, text
    return found[0]


@pytest.mark.parametrize("realfs_kind", ["juicefs", "moosefs"], indirect=True)
def test_a_non_root_holder_on_another_node_reads_what_the_last_one_wrote(
        real_volume: Callable[..., Volume], realfs_kind: str, tmp_path: Path) -> None:
    vol = real_volume("lagging")
    hidepid = realfs_kind == "juicefs"  # MooseFS's title shows no options anyway; JuiceFS's, to anyone
    (tmp_path / "truths").mkdir()
    before = sharedfs_at(BEFORE, tmp_path / "before", fixes=[EEXIST_FIX])["PYTHONPATH"]
    site = _site(tmp_path / "site")
    mount = str(vol.mounts[1])
    with unixusers.throwaway_users(1) as (user,), \
            unixusers.may_run_this_python(user, CHECKOUT, SITE_PACKAGES, str(tmp_path), str(vol.workdir)):
        os.chown(tmp_path / "truths", user.uid, user.gid)
        root, plain, hidden = Runner(None, False), Runner(user, False), Runner(user, hidepid)
        old, new = clean_env({"PYTHONPATH": before}), clean_env({"PYTHONPATH": CHECKOUT})
        declared = clean_env({"PYTHONPATH": f"{site}:{CHECKOUT}", "MYSITE_MOUNTS": str(vol.workdir)})

        # What each can read of the client's options, and the wait sharedfs takes from it.
        seen = {"root, before": root.json([sys.executable, "-c", PROBE, mount], old),
                "user, before": hidden.json([sys.executable, "-c", PROBE, mount], old),
                "user": hidden.json([sys.executable, "-c", PROBE, mount], new),
                "user, /proc unhidden": plain.json([sys.executable, "-c", PROBE, mount], new),
                "user, declared": hidden.json([sys.executable, "-c", PROBE, mount], declared)}
        for who, got in seen.items():
            print(f"{realfs_kind} {who}: waits {got['settle']:g} s; .config {got['.config']}, .params "
                  f"{got['.params']}; client options {got['options']}; process titles {got['titles']}")
        assert seen["root, before"]["settle"] == LAG_S
        rootonly = ".config" if realfs_kind == "juicefs" else ".params"
        assert seen["user"][rootonly] in (errno.errorcode[errno.EACCES], errno.errorcode[errno.EPERM])
        assert seen["user"]["options"] is None
        assert seen["user, before"]["settle"] == 1.0  # the documented default: the old fallback
        assert seen["user"]["settle"] == MAX_SETTLE  # cannot tell: the longest the rule honours
        assert seen["user, declared"]["settle"] == LAG_S
        unhidden = seen["user, /proc unhidden"]
        if realfs_kind == "juicefs":  # its title keeps its options (all users see it) unless it was cut short
            assert seen["user"]["titles"] == [] and unhidden["titles"]
            cut = max(len(title.encode()) for title in unhidden["titles"]) >= TITLE_CAP  # this volume's long paths
            assert unhidden["settle"] == (MAX_SETTLE if cut else LAG_S)
        else:  # mfsmount's title: "mfsmount (mounted on: <mount>)"
            assert unhidden["settle"] == MAX_SETTLE
            assert all("cache" not in title for title in unhidden["titles"])

        # The failure first: sharedfs before this change, as root (the options read) and as the user.
        assert take_turns(vol, root, old, "before-root", INCREMENTS, tmp_path)["stale"] == 0
        stale = take_turns(vol, hidden, old, "before-user", INCREMENTS, tmp_path)
        assert stale["stale"] > 0, "the user's next holder should have read a replaced counter through its cache"

        # A site plugin declares the timeout: the user waits 3 s per cross-node handover and reads no stale value.
        fixed = take_turns(vol, hidden, declared, "declared", INCREMENTS, tmp_path)
        assert (fixed["increments"], fixed["stale"], fixed["errors"], fixed["final"]) == (INCREMENTS, 0, 0, INCREMENTS)

        # Nothing declared: cannot tell, so the longest wait; never a stale read.  One code path for both
        # clients (the wait above says each one takes it): run on one, for its 60 s per handover.
        if realfs_kind == "moosefs":
            assumed = take_turns(vol, hidden, new, "assumed", ASSUMED_INCREMENTS, tmp_path)
            assert (assumed["stale"], assumed["errors"], assumed["final"]) == (0, 0, ASSUMED_INCREMENTS)
            assert assumed["min"] >= MAX_SETTLE

        # ... paid only on a cross-node handover: the same node's next holder goes on at once.
        same = vol.mounts[0] / "same-node"
        same.mkdir()
        os.chown(same, user.uid, user.gid)
        takes = [hidden.json([sys.executable, "-c", ONCE, str(same / "x.lock")], node_env("a", new)) for _ in range(2)]
        print(f"{realfs_kind} same node, nothing declared: acquires took {[round(t['took'], 2) for t in takes]} s")
        assert (takes[0]["first"], takes[1]["same_node"], takes[1]["waits"]) == (1, 1, 0)
        assert takes[1]["took"] < MAX_SETTLE / 4

        # status and doctor say where the wait comes from, in one line.
        python = [sys.executable, "-m", "sharedfs"]
        lines = {"root": _line(root.run([*python, "status", mount], new)),
                 "user": _line(hidden.run([*python, "status", mount], new)),
                 "user, declared": _line(hidden.run([*python, "status", mount], declared)),
                 "user, doctor": _line(hidden.run([*python, "doctor", str(vol.mounts[1] / "declared")], new))}
        for who, line in lines.items():
            print(f"{realfs_kind} {who}: handover   : {line}")
        assert f"waits {LAG_S:g} s, the longest metadata cache timeout in " in lines["root"]
        assert rootonly in lines["root"]
        for line in (lines["user"], lines["user, doctor"]):
            assert f"waits {MAX_SETTLE:g} s, ASSUMED" in line and "cache_seconds" in line
            assert ("hidepid" if hidepid else "readable by root only") in line
        assert f"waits {LAG_S:g} s" in lines["user, declared"] and "declared by a site plugin" in lines["user, declared"]


#: The wait of a MooseFS mount whose ``.params`` this process cannot read, and of the same mount declared.
RULE = textwrap.dedent('''
    import json
    from sharedfs.locks import _handover
    from sharedfs.model.fsinfo import FsInfo, Mount
    info = dict(shared=True, flock="node-local", posix="node-local", o_excl_atomic=True)
    unread = Mount(mount_point="/nonexistent-mfs", fstype="fuse", source="mfs#10.0.0.1:9421", mount_id=10**6)
    declared = Mount(mount_point="/nonexistent-mfs2", fstype="fuse", source="mfs#10.0.0.1:9421", mount_id=10**6 + 1)
    got = {"unread": _handover.settle_seconds(FsInfo(mount=unread, kind="moosefs", **info))}
    try:
        got["declared"] = _handover.settle_seconds(FsInfo(mount=declared, kind="moosefs", cache_seconds=3.0, **info))
    except TypeError:  # no such field before this change
        got["declared"] = None
    print(json.dumps(got))
''')


def test_options_nobody_here_can_read_mean_the_longest_wait_or_the_declared_one(tmp_path: Path) -> None:
    """Without a volume: a MooseFS mount whose options were not read (``client_options`` None) waited the
    documented 1 s default before this change; now the longest wait, or what a site plugin declares."""
    before = sharedfs_at(BEFORE, tmp_path / "before")["PYTHONPATH"]
    runs = {name: subprocess.run([sys.executable, "-c", RULE], env=clean_env({"PYTHONPATH": where}), cwd="/",
                                 capture_output=True, text=True, timeout=120)
            for name, where in (("before", before), ("now", CHECKOUT))}
    for run in runs.values():
        assert run.returncode == 0, run.stderr[-3000:]
    old, new = (json.loads(runs[name].stdout.strip().splitlines()[-1]) for name in ("before", "now"))
    print(f"options unread: waited {old['unread']:g} s before, {new['unread']:g} s now; declared 3 s: "
          f"{new['declared']:g} s")
    assert old == {"unread": 1.0, "declared": None}
    assert new == {"unread": MAX_SETTLE, "declared": 3.0}
    assert "ASSUMED" in runs["now"].stderr and "readable by root only" in runs["now"].stderr  # said once, why
    from sharedfs.model.fsinfo import FsInfo, Mount
    for wrong in (-1.0, float("nan"), True, "3"):
        with pytest.raises(ValueError, match="cache_seconds"):
            FsInfo(mount=Mount(mount_point="/x", fstype="fuse"), kind="moosefs", shared=True, flock="coherent",
                   posix="coherent", o_excl_atomic=True, cache_seconds=wrong)  # type: ignore[arg-type]

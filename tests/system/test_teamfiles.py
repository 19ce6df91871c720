"""sharedfs.cluster.teamfiles: what this process creates in a watched team cache becomes the group's, and nothing else.

Run in a child interpreter: the recorder is an audit hook, which cannot be removed from
the process that installed it (the test runner must not keep one).  Real users and
real frameworks are in tests/integration/test_team_cache.py; this checks the rules:
creations under a watched root are given to the group (a directory renamed into place
takes its records along), nothing outside a root is touched, a symlink or a hard link
swapped in for a recorded entry is never followed, the umask is never changed, and what
is made outside any lock is the group's within ``DRAIN_DELAY``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from helpers import clean_env

CHILD = textwrap.dedent("""
    import json, os, stat, sys, threading, time
    from sharedfs.cluster import teamfiles
    from sharedfs.model.policy import TeamCache

    base = sys.argv[1]
    root, outside, private = (os.path.join(base, name) for name in ("cache", "elsewhere", "private"))
    for directory in (root, outside, private):
        os.mkdir(directory)
    team = TeamCache(gid=int(sys.argv[2]), file_mode=0o660, reason="test")
    teamfiles.WATCHED[os.path.realpath(root)] = team
    teamfiles._install()
    os.umask(0o022)
    umask_seen = []
    stop = threading.Event()

    def watch_umask():  # another thread: the umask must never change while the cache is written
        while not stop.is_set():
            mask = os.umask(0o022); os.umask(mask); umask_seen.append(mask)

    watcher = threading.Thread(target=watch_umask); watcher.start()

    # what a framework does: makedirs, write into a temp directory, rename it into place, chmod narrower
    os.makedirs(os.path.join(root, "json", "default"))
    os.makedirs(os.path.join(root, "json", "default.incomplete"))
    with open(os.path.join(root, "json", "default.incomplete", "train.arrow"), "w") as fh:
        fh.write("rows")
    os.rmdir(os.path.join(root, "json", "default"))
    os.rename(os.path.join(root, "json", "default.incomplete"), os.path.join(root, "json", "default"))
    with open(os.path.join(root, "narrowed"), "w"):
        pass
    os.chmod(os.path.join(root, "narrowed"), 0o600)
    # outside every root
    with open(os.path.join(outside, "notes"), "w"):
        pass
    # the entries a group member swaps after we created them: a symlink and a hard link to our private files
    secret = os.path.join(private, "secret"); open(secret, "w").close(); os.chmod(secret, 0o600)
    linked = os.path.join(private, "linked"); open(linked, "w").close(); os.chmod(linked, 0o600)
    for name in ("swapped-symlink", "swapped-hardlink"):
        open(os.path.join(root, name), "w").close()
    os.unlink(os.path.join(root, "swapped-symlink")); os.symlink(secret, os.path.join(root, "swapped-symlink"))
    os.unlink(os.path.join(root, "swapped-hardlink")); os.link(linked, os.path.join(root, "swapped-hardlink"))

    recorded = len(teamfiles._pending)
    changed = teamfiles.settle_pending()
    # no lock, no exit: the background pass gives what was made within DRAIN_DELAY
    os.mkdir(os.path.join(root, "later"))
    open(os.path.join(root, "later", "file"), "w").close()
    time.sleep(teamfiles.DRAIN_DELAY + 1.5)
    later = [oct(stat.S_IMODE(os.stat(os.path.join(root, *p)).st_mode)) for p in (("later",), ("later", "file"))]
    stop.set(); watcher.join()

    def mode(path):
        st = os.lstat(path)
        return [oct(stat.S_IMODE(st.st_mode)), st.st_gid]

    print(json.dumps({
        "recorded": recorded, "changed": changed, "umasks": sorted(set(umask_seen)), "later": later,
        "json": mode(os.path.join(root, "json")), "default": mode(os.path.join(root, "json", "default")),
        "arrow": mode(os.path.join(root, "json", "default", "train.arrow")),
        "narrowed": mode(os.path.join(root, "narrowed")),
        "outside": mode(os.path.join(outside, "notes")),
        "secret": mode(secret), "linked": mode(linked),
    }))
""")


def test_creations_in_a_watched_root_become_the_groups_and_nothing_else_does(tmp_path: Path) -> None:
    import grp

    gid = next((g.gr_gid for g in grp.getgrall() if g.gr_gid != 0), 0)  # a group that is not root's own
    proc = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path), str(gid)], capture_output=True, text=True,
                          env=clean_env(), cwd="/", timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["umasks"] == [0o022]  # never changed, as seen from another thread
    assert got["later"] == ["0o2775", "0o664"]  # given in the background, without a lock or an exit
    assert got["json"] == ["0o2775", gid] and got["default"] == ["0o2775", gid]
    assert got["arrow"] == ["0o664", gid]  # recorded under default.incomplete/, renamed along with it
    assert got["narrowed"] == ["0o660", gid]  # a later chmod is recorded too: the group's bits come back
    owner_gid = __import__("os").getgid()
    assert got["outside"] == ["0o644", owner_gid]
    assert got["secret"] == ["0o600", owner_gid] and got["linked"] == ["0o600", owner_gid]

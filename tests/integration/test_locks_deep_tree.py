"""A member's chain of 2,100 directories in a team cache no longer holds root's ``sharedfs locks --clear-dead``.

Real throwaway user bob, a member of the team, makes chains ``d/d/d/...`` of 40, 80 and 2,100
directories in the team's ``2775 root:<group>`` directory (by descriptor: the deepest path is
longer than PATH_MAX), and leaves a lock whose holder he SIGKILLed 40 levels down the deepest.

* sharedfs as it was (:data:`BEFORE`) opened each directory by re-descending from the top, one
  ``openat`` per level, and counted each against its 2,000 calls/s budget: the filesystem calls per
  directory grow with its depth (strace, counted per added level between 0, 40 and 80 levels),
  depth²/2 in all -- about 2.2 million calls and 18 minutes at 2,100 levels.
* Now each directory is opened once from its parent's descriptor: the calls per directory are the
  same at every depth, and a directory more than 128 levels down is not entered but reported (one
  line, a ``too-deep`` row in ``--json``, exit 1), while the dead lock above it is cleared.

Counts of system calls, never times: a count repeats exactly on a loaded machine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from harness.skips import skip_or_fail
from helpers import clean_env
from helpers.shardcache_support import User, group_of_users, scratch, sharedfs_at

from sharedfs.commands.lockfiles import MAX_DEPTH

pytestmark = pytest.mark.slow

#: sharedfs before this change: ``Walk.enter`` -> ``Place.open`` re-descended from the top for every directory.
BEFORE = "18c02b80ce3b03e9547d268701a4c5939cb3ba67"

#: The chains bob makes (0: an empty directory, for what start-up alone costs), and where his dead lock is.
DEPTHS = (0, 40, 80, 2100)
DEAD_AT = 40

NODE = {"SHAREDFS_NODE_ID": "node1"}

#: bob's chain: argv[1]/d/d/... argv[2] levels, each made and entered relative to its parent's descriptor.
CHAIN = textwrap.dedent("""
    import os, sys
    fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(int(sys.argv[2])):
        os.mkdir("d", dir_fd=fd)
        below = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = below
""")

#: Takes the soft lock argv[1], says so, waits to be killed.
HOLDER = textwrap.dedent("""
    import sys, time, sharedfs
    lock = sharedfs.lock(sys.argv[1], kind="soft", timeout=30)  # kept: a lock object collected is released
    lock.acquire()
    print("held", flush=True)
    time.sleep(3600)
""")


@dataclass
class Team:
    chains: dict[int, Path]  # depth -> the top of bob's chain of that depth
    bob: User
    before: dict[str, str]  # env that runs sharedfs as it was
    work: Path  # root's scratch space (strace output)


@pytest.fixture(scope="module")
def team() -> Iterator[Team]:
    if shutil.which("strace") is None:
        skip_or_fail("needs strace to count system calls")
    with scratch("sharedfs-deep-") as root, group_of_users(1, root) as (bob,):
        shared = root / "team"
        shared.mkdir()
        os.chown(shared, 0, bob.group)
        shared.chmod(0o2775)
        try:
            chains = {}
            for depth in DEPTHS:
                top = shared / f"chain{depth}"
                made = bob.run(["mkdir", str(top)])
                assert made.returncode == 0, made.stderr
                made = bob.python(CHAIN, str(top), str(depth))
                assert made.returncode == 0, made.stderr
                chains[depth] = top
            work = root / "work"
            work.mkdir()
            yield Team(chains, bob, sharedfs_at(BEFORE, root / "before"), work)
        finally:
            # shutil.rmtree (scratch's clean-up) recurses once per level: past Python's limit at 2,100.
            subprocess.run(["rm", "-rf", str(shared)], check=False)
            assert not shared.exists(), f"{shared} left behind"


def _calls(team: Team, top: Path, env: dict[str, str], label: str) -> dict[str, int]:
    """File and descriptor system calls of root's ``sharedfs locks --clear-dead --json TOP``, by name, and total."""
    out = team.work / f"strace-{label}-{top.name}"
    done = subprocess.run(["strace", "-f", "-c", "-o", str(out), "-e", "trace=%file,%desc", sys.executable, "-m",
                           "sharedfs", "locks", "--clear-dead", "--json", str(top)], capture_output=True, text=True,
                          timeout=600, env=clean_env({**NODE, **env}), cwd="/")
    assert done.returncode in (0, 1), done.stderr
    counts = {}
    for line in out.read_text().splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[3].isdigit() and not line.startswith("-"):
            counts[fields[-1]] = int(fields[3])  # % time, seconds, usecs/call, calls, [errors,] syscall
    assert "total" in counts and "openat" in counts, out.read_text()
    return counts


def _per_level(counts: dict[int, dict[str, int]], call: str, low: int, high: int) -> float:
    """System calls named ``call`` that each level between ``low`` and ``high`` added."""
    return (counts[high][call] - counts[low][call]) / (high - low)


def test_the_walk_makes_the_same_calls_per_directory_at_every_depth(team: Team) -> None:
    seen = {}
    for variant, env in (("before", team.before), ("fixed", {})):
        counts = {depth: _calls(team, team.chains[depth], env, variant) for depth in DEPTHS[:3]}
        seen[variant] = {call: (_per_level(counts, call, 0, 40), _per_level(counts, call, 40, 80))
                         for call in ("openat", "total")}
        print(f"{variant}: per directory, levels 1-40 / 41-80: openat {seen[variant]['openat'][0]:.1f} / "
              f"{seen[variant]['openat'][1]:.1f}, all file and descriptor calls {seen[variant]['total'][0]:.1f} / "
              f"{seen[variant]['total'][1]:.1f}")
    first, second = seen["before"]["openat"]
    # Re-descending from the top: the 41st to 80th directories cost about three times the first forty's opens.
    assert second > 2 * first and second > 20, f"the old walk's opens did not grow with depth: {seen['before']}"
    print(f"before: at 2,100 levels that is about {2100 * 2101 // 2:,} opens, each counted against 2,000 calls/s")
    for call in ("openat", "total"):
        first, second = seen["fixed"][call]
        assert abs(second - first) <= 0.1, f"{call} per directory grows with depth: {seen['fixed']}"
    # One open per directory, from its parent's descriptor; all told 12 calls on Linux with CPython 3.11: the open
    # and its identity fstat, the listing (scandir of a descriptor: dup, fstat, 2 fcntl, 2 getdents64, lseek,
    # close), the entry's fstatat, the close.
    assert seen["fixed"]["openat"][1] <= 1.1 and seen["fixed"]["total"][1] <= 16, seen["fixed"]


def test_roots_clear_on_a_members_2100_level_chain_clears_above_the_limit_and_reports_below(team: Team) -> None:
    top = team.chains[2100]
    # What the fixed walk costs there: the 128 levels it enters, at the per-level cost of the chains above.
    counts = {depth: _calls(team, team.chains[depth], {}, "bound") for depth in (40, 80, 2100)}
    per_level = _per_level(counts, "total", 40, 80)
    expected = counts[80]["total"] + (MAX_DEPTH + 1 - 80) * per_level
    print(f"fixed, 2,100 levels: {counts[2100]['total']:,} calls (the first {MAX_DEPTH} levels at "
          f"{per_level:.1f} per level: {expected:,.0f})")
    assert counts[2100]["total"] <= expected + 2 * per_level, counts

    lock = top.joinpath(*["d"] * DEAD_AT, "x.lock")
    holder = team.bob.popen([sys.executable, "-c", HOLDER, str(lock)], env=NODE)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held", holder.communicate()
    os.killpg(holder.pid, 9)
    holder.wait()
    marker = Path(f"{lock}.held")
    assert marker.exists(), os.listdir(lock.parent)

    done = subprocess.run([sys.executable, "-m", "sharedfs", "locks", "--clear-dead", "--json", str(top)],
                          capture_output=True, text=True, timeout=600, env=clean_env(NODE), cwd="/")
    rows = json.loads(done.stdout)
    print(f"root's --clear-dead: exit {done.returncode}; stderr: {done.stderr[-600:]}")
    deep = [row for row in rows if row["kind"] == "too-deep"]
    not_walked = os.path.join(str(top), *["d"] * (MAX_DEPTH + 1))
    assert len(deep) == 1 and deep[0]["lock"] == not_walked and deep[0]["state"] == "unknown", rows
    assert f"more than {MAX_DEPTH} levels below {top}" in deep[0]["evidence"], deep
    # The dead lock above the limit is cleared, through its own protocol: the walk above the limit is whole.
    (cleared,) = [row for row in rows if row["kind"] == "marker"]
    assert cleared["state"] == "dead" and cleared["cleared"] is True and not marker.exists(), rows
    # Never fail open: an answer with a subtree nobody looked at is not "nothing held".
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    assert lines == [f"sharedfs locks: not walked: {not_walked}: {deep[0]['evidence']}"], lines

    # The text output says it in one line too, and so does a selection that matches nothing else.
    text = subprocess.run([sys.executable, "-m", "sharedfs", "locks", "--user", team.bob.name, str(top)],
                          capture_output=True, text=True, timeout=600, env=clean_env(NODE), cwd="/")
    assert text.returncode == 1 and "no lock is held here" in text.stdout, (text.stdout, text.stderr)
    assert [line for line in text.stderr.splitlines() if "not walked" in line] == lines, text.stderr

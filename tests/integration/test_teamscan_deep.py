"""A member's 2,100-level chain in a team directory no longer crashes `sharedfs doctor`; it is reported.

Real throwaway users: alice and bob in one project group, a team directory ``2775 root:<group>``
holding alice's results and bob's chain ``d/d/d/...`` of 2,100 directories.  doctor's team scan
(who shares the path, which entries keep a member out) walked the tree with ``os.walk``, which
recurses once per level: past Python's recursion limit (about 1,000) the whole ``sharedfs doctor``
died with a RecursionError traceback, for root and for alice alike (sharedfs as it was,
:data:`BEFORE`).  Now the scan is a loop over a stack of directories opened by descriptor, at most
:data:`~sharedfs.commands.lockfiles.MAX_DEPTH` levels deep and :data:`TEAM_SCAN_LIMIT` entries: doctor
reports the team directory as before and says in one line where it stopped
("not fully scanned: deeper than 128 levels at ...").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import clean_env
from helpers.shardcache_support import User, group_of_users, scratch, sharedfs_at

from sharedfs.commands.lockfiles import MAX_DEPTH
from sharedfs.commands.teamscan import TEAM_SCAN_LIMIT

pytestmark = pytest.mark.slow

#: sharedfs before this change: the team scan was ``os.walk`` (one recursion per level).
BEFORE = "18c02b80ce3b03e9547d268701a4c5939cb3ba67"
DEPTH = 2100
RUNS = 3

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


@dataclass
class Scene:
    team: Path
    chain: Path
    alice: User
    bob: User
    before: dict[str, str]


@pytest.fixture(scope="module")
def scene() -> Iterator[Scene]:
    with scratch("sharedfs-teamscan-deep-") as root, group_of_users(2, root) as (alice, bob):
        team = root / "team"
        team.mkdir()
        os.chown(team, 0, alice.group)
        team.chmod(0o2775)
        try:
            made = alice.run(["mkdir", str(team / "results")])
            assert made.returncode == 0, made.stderr
            for i in range(3):
                assert alice.run(["touch", str(team / "results" / f"ckpt-{i}.pt")]).returncode == 0
            chain = team / "chain"
            assert bob.run(["mkdir", str(chain)]).returncode == 0
            made = bob.python(CHAIN, str(chain), str(DEPTH))
            assert made.returncode == 0, made.stderr
            yield Scene(team, chain, alice, bob, sharedfs_at(BEFORE, root / "before"))
        finally:
            # shutil.rmtree (scratch's clean-up) recurses once per level too: past Python's limit at 2,100.
            subprocess.run(["rm", "-rf", str(team)], check=False)
            assert not team.exists(), f"{team} left behind"


def _doctor(scene: Scene, runner: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "sharedfs", "doctor", "--json", str(scene.team)]
    if runner == "root":
        return subprocess.run(argv, capture_output=True, text=True, timeout=600, env=clean_env(env), cwd="/")
    return scene.alice.run(argv, env=env, timeout=600)


@pytest.mark.parametrize("runner", ["root", "alice"])
def test_doctor_on_a_team_directory_with_a_2100_level_chain_reports_where_it_stopped(scene: Scene, runner) -> None:
    crashed = []
    for _ in range(RUNS):
        done = _doctor(scene, runner, scene.before)
        crashed.append(done.returncode != 0 and "RecursionError" in done.stderr)
    print(f"before, {runner}: doctor crashed with RecursionError in {sum(crashed)} of {RUNS} runs;",
          done.stderr.strip().splitlines()[-1:])
    assert all(crashed), "the deep chain did not crash doctor as it was: the test shows nothing"

    # The chain's top is 1 level below the team directory: the scan lists MAX_DEPTH levels, and enters no deeper one.
    deepest = scene.chain.joinpath(*["d"] * MAX_DEPTH)
    reported = []
    for _ in range(RUNS):
        done = _doctor(scene, runner, {})
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
        (report,) = json.loads(done.stdout)["paths"]
        team = report["team"]
        assert team["too_deep"] == str(deepest), team["too_deep"]
        assert team["scanned"] < TEAM_SCAN_LIMIT and not team["truncated"], team
        assert {scene.alice.name, scene.bob.name} <= set(team["owners"]), team["owners"]
        reported.append(team["too_deep"] is not None)
    print(f"fixed, {runner}: reported the chain in {sum(reported)} of {RUNS} runs, "
          f"{team['scanned']} entries scanned")

    text = _text(scene, runner)
    lines = [line for line in text.splitlines() if "not fully scanned" in line]
    assert lines == [f"  team note  : not fully scanned: deeper than {MAX_DEPTH} levels at {deepest}; no "
                     "framework's cache nests so deep, so nothing below was looked at"], text


def _text(scene: Scene, runner: str) -> str:
    argv = [sys.executable, "-m", "sharedfs", "doctor", str(scene.team)]
    if runner == "root":
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=clean_env({}), cwd="/")
    else:
        done = scene.alice.run(argv, env={}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout

"""``sharedfs doctor``'s team advice: a recursive permission change only for a tree of one group's members.

Before: on ``/tmp`` (sticky, world-writable, every user's files) the "team" section said "NOT a team
cache ... yet shared" and told the admin to ``chgrp -R <group> /tmp`` and ``chmod -R g+rwX /tmp``:
every user's files there writable by one group.  Real users, real owners, real modes.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

from helpers.shardcache_support import group_of_users, scratch

from sharedfs.commands.teamscan import team_check, team_lines
from sharedfs.machinery import runtime

RECURSIVE = ("chgrp -R", "chmod -R", "setfacl -R", "-exec chmod")


def tree(root: Path, name: str, mode: int, gid: int, owners: list[int]) -> Path:
    top = root / name
    top.mkdir()
    os.chown(top, 0, gid)
    top.chmod(mode)
    for uid in owners:
        entry = top / f"file-of-{uid}"
        entry.write_text("x")
        os.chown(entry, uid, -1)
    return top


def advice(path: Path) -> tuple[dict, str]:
    report = team_check(str(path), runtime.policy())
    return report, "\n".join(team_lines(report, str(path)))


def test_a_sticky_or_world_writable_directory_gets_no_recursive_fix() -> None:
    with scratch() as root, group_of_users(2, root) as (a, b):
        for mode, what in ((0o1777, "sticky and world-writable"), (0o0777, "world-writable")):
            top = tree(root, f"public-{mode:o}", mode, 0, [a.uid, b.uid])
            report, text = advice(top)
            assert report["shared"] and not report["candidate"] and report["fix"] == [], report
            assert f"it is {what}" in text and "No permission change is suggested" in text
            assert not any(command in text for command in RECURSIVE), text


def test_this_machines_tmp_gets_no_recursive_fix() -> None:
    done = subprocess.run([sys.executable, "-m", "sharedfs", "doctor", "/tmp"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "team fix" not in done.stdout and not any(command in done.stdout for command in RECURSIVE), done.stdout
    assert "not a candidate" in done.stdout


def test_entries_of_users_outside_one_group_get_no_fix_and_members_get_a_fix_scoped_to_the_tree() -> None:
    with scratch() as root, group_of_users(2, root) as (a, b), group_of_users(1, root) as (outsider,):
        mixed = tree(root, "mixed", 0o0775, a.group, [a.uid, outsider.uid])
        report, text = advice(mixed)
        assert not report["candidate"] and report["fix"] == [] and "share no group" in text, report
        assert not any(command in text for command in RECURSIVE), text

        members = tree(root, "members", 0o0775, a.group, [a.uid, b.uid])
        report, text = advice(members)
        assert report["candidate"] and report["fix"], report
        assert all(command.endswith(shlex.quote(str(members))) or f"{shlex.quote(str(members))} -type d" in command
                   for command in report["fix"]), report["fix"]
        assert report["group"] not in ("<your-team-group>",) and "team fix" in text

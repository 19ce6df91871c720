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


def test_the_fix_for_an_hf_home_leaves_its_module_cache_read_only_to_the_group() -> None:
    """Run the advice on a team ``HF_HOME``: the tree-wide ``chmod -R g+rwX`` alone made every module
    file group-writable, so a member's edit would run in another member's process (docs/security.md,
    "Code in a team's module cache"); the module cache's own lines undo that for ``modules/``."""
    with scratch() as root, group_of_users(2, root) as (a, b):
        home = tree(root, "hf", 0o0750, a.group, [a.uid, b.uid])
        module = home / "modules" / "transformers_modules" / "acc" / "a" / "helpers.py"
        module.parent.mkdir(parents=True)
        module.write_text("x = 1\n")
        for level in (module, *module.parents):
            os.chown(level, a.uid, a.group)
            if level == home / "modules":
                break
        report, _ = advice(home)
        assert report["candidate"], report
        code = [line for line in report["fix"] if "modules" in line]
        tree_wide = [line for line in report["fix"] if line not in code]
        assert any("chmod -R g+rwX" in line for line in tree_wide), report["fix"]

        def run(lines: list[str]) -> None:
            for line in lines:
                subprocess.run(line, shell=True, check=True, timeout=60)

        run(tree_wide)  # the advice as it was: the module file is the group's to write
        assert module.stat().st_mode & 0o020, oct(module.stat().st_mode)
        run(code)
        assert not module.stat().st_mode & 0o022, oct(module.stat().st_mode)
        assert module.parent.stat().st_mode & 0o1000, oct(module.parent.stat().st_mode)
        assert not (home / "modules").stat().st_mode & 0o020
        assert (home / f"file-of-{b.uid}").stat().st_mode & 0o020  # the rest stays the group's to write

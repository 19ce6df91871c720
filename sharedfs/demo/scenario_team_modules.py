"""The demo's team ``HF_MODULES_CACHE``: two real users of a lab's ``HF_HOME`` load remote-code models.

A lab makes one ``HF_HOME`` for everyone: root's, the lab's group, ``chmod 2775``.  Two
throwaway users of a throwaway group (:mod:`sharedfs.demo.accounts`: ``useradd``/``groupadd``,
removed afterwards; root only) run ``AutoConfig.from_pretrained(repo, trust_remote_code=True)``
under umask 022 from an offline hub cache (:mod:`sharedfs.demo.remotecode`): alice loads
``acc/a``, then bob loads ``acc/b``.  Without sharedfs bob fails with ``PermissionError:
[Errno 13]`` on ``transformers_modules/acc/b`` (alice's ``acc/`` is 2755); with sharedfs
both load.  The programs make no ``sharedfs.`` call: ``SHAREDFS_DISABLE=1`` is the only
difference between the two runs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from sharedfs.demo.accounts import group_of_users

__all__ = ["LOAD", "Member", "members", "run"]

LOAD = textwrap.dedent("""
    import json, sys
    from transformers import AutoConfig
    repo = sys.argv[1]
    try:
        print(json.dumps(f"ok {AutoConfig.from_pretrained(repo, trust_remote_code=True).model_type}"))
    except Exception as exc:
        print(json.dumps(f"{type(exc).__name__}: {exc}"))
""")


@dataclass(frozen=True)
class Member:
    name: str
    uid: int
    gid: int  # the user's own group
    team: int  # the group both members are in
    home: Path

    def run(self, argv: list[str], env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
        """``argv`` as this member, umask 022, in a session of its own (a timeout kills all of it)."""
        with subprocess.Popen(argv, env={**env, "HOME": str(self.home), "USER": self.name}, cwd=str(self.home),
                              user=self.uid, group=self.gid, extra_groups=[self.team], umask=0o022, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True) as proc:
            try:
                out, err = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                out, err = proc.communicate()
                err += f"\nhung: killed after {timeout:.0f} s"
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def members(stack: ExitStack, count: int = 2) -> tuple[Path, list[Member]]:
    """A scratch directory every user can reach and ``count`` new users in a new group; all removed at exit.

    The users and the group are :func:`sharedfs.demo.accounts.group_of_users`' (the tests' too);
    it raises :class:`~sharedfs.demo.accounts.UsersUnavailable` where this machine cannot make them.
    """
    parent = "/var/tmp" if os.path.isdir("/var/tmp") else None
    scratch = Path(tempfile.mkdtemp(prefix="sharedfs-demo-team-", dir=parent))
    scratch.chmod(0o755)
    stack.callback(shutil.rmtree, scratch, ignore_errors=True)
    made = stack.enter_context(group_of_users(count, scratch, prefix="sfd"))
    return scratch, [Member(m.name, m.uid, m.gid, m.group, m.home) for m in made]


def run(scratch: Path, alice: Member, bob: Member, label: str, env: dict[str, str]) -> list[str]:
    """alice loads ``acc/a``, then bob ``acc/b``, in a fresh 2775 ``HF_HOME``; each one's outcome."""
    from sharedfs.demo.remotecode import make_repo

    hub = scratch / "hub"
    if not hub.exists():
        for repo in ("acc/a", "acc/b"):
            make_repo(hub, repo)
        for path in (hub, *hub.rglob("*")):
            path.chmod(0o755 if path.is_dir() else 0o644)
    home = scratch / f"hf-{label}"
    home.mkdir()
    os.chown(home, 0, alice.team)
    home.chmod(0o2775)
    env = {**env, "HF_HOME": str(home), "HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1",
           "HF_HUB_DISABLE_TELEMETRY": "1", "TRANSFORMERS_VERBOSITY": "error"}
    outcomes = []
    for member, repo in ((alice, "acc/a"), (bob, "acc/b")):
        proc = member.run([sys.executable, "-c", LOAD, repo], env)
        lines = proc.stdout.strip().splitlines()
        outcomes.append(json.loads(lines[-1]) if lines else
                        (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1])
    return outcomes

"""The makedirs guard on a local disk: ``os.makedirs`` and ``Path.mkdir`` exactly as the standard library.

For every argument combination over every kind of path in the way (an existing directory, a
regular file, a missing parent, a file as parent, symlinks to a directory and to a file, a
dangling symlink, ``.``, the empty path, bytes, a directory the caller may not write), the
guarded functions must end as the unpatched ones do: the same exception type, errno, message
and filenames, or the same success, and the same tree left behind (names and modes).  Both the
shim's guard and the pending guards ``import torch`` puts in place are compared.  The
comparison runs in a separate interpreter, as root and as a throwaway user (permission
denied exists only for the latter), and first shows it can tell: the usual hand-written fix
(``except FileExistsError: pass`` when ``exist_ok``) differs from the standard library.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
from pathlib import Path

from helpers import clean_env, unixusers

import sharedfs

CHECKOUT = str(Path(sharedfs.__file__).resolve().parents[1])
SITE = sysconfig.get_paths()["purelib"]

COMPARE = textwrap.dedent(r'''
    import functools, json, os, pathlib, shutil, stat, sys

    root = sys.argv[1]
    os.umask(0o022)
    stdlib = {"makedirs": os.makedirs, "mkdir": pathlib.Path.mkdir}


    def build():
        if os.path.isdir(os.path.join(root, "ro")):
            os.chmod(os.path.join(root, "ro"), 0o755)  # the last case's tree: let it be removed
        shutil.rmtree(root, ignore_errors=True)
        os.mkdir(root)
        os.mkdir(os.path.join(root, "d"))
        with open(os.path.join(root, "f"), "w") as fh:
            fh.write("x")
        os.symlink("d", os.path.join(root, "ld"))
        os.symlink("f", os.path.join(root, "lf"))
        os.symlink("nowhere", os.path.join(root, "dl"))
        os.makedirs(os.path.join(root, "ro", "d"))
        os.chmod(os.path.join(root, "ro"), 0o555)


    def tree():
        found = []
        for dirpath, dirnames, filenames in os.walk(root):
            for name in sorted(dirnames + filenames):
                path = os.path.join(dirpath, name)
                found.append((os.path.relpath(path, root), oct(os.lstat(path).st_mode)))
        return sorted(found)


    PATHS = ["d", "new", "a/b/c", "f", "f/x", "m/x", "ld", "lf", "dl", "dl/x", "d/.", "n/.", "d/", "ro/d",
             "ro/new", "ro/new/x", ""]
    CASES = []
    for rel in PATHS:
        for mode in (0o777, 0o700):
            for exist_ok in (False, True):
                CASES.append(("makedirs", rel, mode, None, exist_ok, False))
                if rel:
                    CASES.append(("makedirs", rel, mode, None, exist_ok, True))  # bytes
                for parents in (False, True):
                    CASES.append(("mkdir", rel, mode, parents, exist_ok, False))


    def run(case):
        kind, rel, mode, parents, exist_ok, as_bytes = case
        build()
        path = os.path.join(root, rel) if rel else ""
        try:
            if kind == "makedirs":
                os.makedirs(os.fsencode(path) if as_bytes else path, mode, exist_ok=exist_ok)
            else:
                pathlib.Path(path).mkdir(mode, parents=parents, exist_ok=exist_ok)
            outcome = ["ok"]
        except Exception as exc:
            outcome = [type(exc).__name__, getattr(exc, "errno", None), str(exc),
                       os.fsdecode(exc.filename) if getattr(exc, "filename", None) is not None else None,
                       getattr(exc, "filename2", None), list(getattr(exc, "__notes__", []))]
        return [outcome, tree()]


    def naive(original):  # the usual hand-written fix, for the comparison to show it can tell
        @functools.wraps(original)
        def makedirs(name, mode=0o777, exist_ok=False):
            try:
                original(name, mode, exist_ok)
            except FileExistsError:
                if not exist_ok:
                    raise
        return makedirs


    results = {"stdlib": [run(case) for case in CASES]}
    os.makedirs = naive(stdlib["makedirs"])
    results["naive"] = [run(case) for case in CASES]
    os.makedirs = stdlib["makedirs"]

    from sharedfs.model.policy import resolve
    from sharedfs.shims.makedirs import MakedirsShim

    shim = MakedirsShim()
    shim.patch(resolve([]))
    guarded = (os.makedirs, pathlib.Path.mkdir)
    results["guarded"] = [run(case) for case in CASES]
    shim.unpatch()

    # What `import torch` puts in place (sharedfs.machinery.pending): stdlib-only guards that apply the
    # shim at their first error that could be its own.  Put back before every case, so each case meets them.
    from sharedfs.machinery import pending

    def pending_case(case):
        shim.unpatch()
        pending.withdraw()
        pending.install(lambda: shim.patch(resolve([])))
        return run(case)

    results["pending"] = [pending_case(case) for case in CASES]
    shim.unpatch()
    pending.withdraw()
    results["patched"] = [guarded[0] is not stdlib["makedirs"], guarded[1] is not stdlib["mkdir"]]
    results["restored"] = [os.makedirs is stdlib["makedirs"], pathlib.Path.mkdir is stdlib["mkdir"]]
    results["cases"] = [list(case) for case in CASES]
    os.chmod(os.path.join(root, "ro"), 0o755)
    print(json.dumps(results))
''')


def _compare(argv: list[str], root: Path, **kwargs: object) -> dict:
    out = subprocess.run([*argv, "-c", COMPARE, str(root)], capture_output=True, text=True, timeout=120,
                         env=clean_env(), **kwargs)  # type: ignore[call-overload]
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _differences(results: dict, impl: str) -> list:
    return [(case, want, got) for case, want, got in zip(results["cases"], results["stdlib"], results[impl])
            if want != got]


def _check(results: dict, *, denied: bool) -> None:
    # The comparison can tell: the hand-written fix accepts a regular file (and a link to one) for a directory.
    naive = _differences(results, "naive")
    assert naive and all(got[0] == ["ok"] and want[0][0] == "FileExistsError" for _, want, got in naive), naive
    assert results["patched"] == [True, True]
    assert _differences(results, "guarded") == []
    assert _differences(results, "pending") == []
    assert results["restored"] == [True, True]
    outcomes = {want[0][0] for want in results["stdlib"]}
    assert {"ok", "FileExistsError", "FileNotFoundError", "NotADirectoryError"} <= outcomes, outcomes
    assert ("PermissionError" in outcomes) is denied, outcomes


def test_guard_matches_the_standard_library_for_every_argument_combination(tmp_path: Path) -> None:
    results = _compare([sys.executable], tmp_path / "tree")
    _check(results, denied=os.geteuid() != 0)


def test_guard_matches_the_standard_library_where_permission_is_denied() -> None:
    with unixusers.throwaway_users(1) as (user,):
        # In /tmp, not under tmp_path: the user would need an ACL on pytest's private /tmp/pytest-of-root, which
        # every pytest session that starts meanwhile chmods back to 0700, clearing the ACL's mask (a PermissionError
        # half-way when another session started).
        work = Path(tempfile.mkdtemp(prefix="sharedfs-semantics-"))
        os.chown(work, user.uid, user.gid)
        try:
            with unixusers.may_run_this_python(user, CHECKOUT, SITE, str(work)):
                results = _compare([sys.executable], work / "tree", user=user.uid, group=user.gid, extra_groups=[],
                                   start_new_session=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    _check(results, denied=True)

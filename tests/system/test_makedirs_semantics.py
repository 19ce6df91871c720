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

The same comparison runs again on a filesystem classified as shared (hostilefs, an honest FUSE
passthrough), where the guard is live, with ``SHAREDFS_WAIT_TIMEOUT=3``: every case must also end
in under a second (a slower one is timed again: a loaded machine's stall is not a wait).  Before, a dangling symlink as a parent (``os.makedirs("dl/x")``, also four
levels deep, either ``exist_ok``) waited the whole timeout; and an ``exist_ok=False`` error a caller
had handled made a later, unrelated mkdir below that directory (since removed) wait it too.
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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from harness.skips import skip_or_fail
from helpers import clean_env, unixusers

import sharedfs
from sharedfs.demo import hostilefs

CHECKOUT = str(Path(sharedfs.__file__).resolve().parents[1])
SITE = sysconfig.get_paths()["purelib"]

COMPARE = textwrap.dedent(r'''
    import functools, json, os, pathlib, shutil, stat, sys, time

    root = sys.argv[1]
    os.umask(0o022)
    stdlib = {"makedirs": os.makedirs, "mkdir": pathlib.Path.mkdir}


    def build():
        for locked in ("ro", "nx"):
            if os.path.isdir(os.path.join(root, locked)):
                os.chmod(os.path.join(root, locked), 0o755)  # the last case's tree: let it be removed
        shutil.rmtree(root, ignore_errors=True)
        os.mkdir(root)
        os.mkdir(os.path.join(root, "d"))
        with open(os.path.join(root, "f"), "w") as fh:
            fh.write("x")
        os.symlink("d", os.path.join(root, "ld"))
        os.symlink("f", os.path.join(root, "lf"))
        os.symlink("nowhere", os.path.join(root, "dl"))
        os.symlink("loop", os.path.join(root, "loop"))  # ELOOP
        os.makedirs(os.path.join(root, "ro", "d"))
        os.chmod(os.path.join(root, "ro"), 0o555)  # no write: EACCES (as a user)
        os.makedirs(os.path.join(root, "nx", "d"))
        os.chmod(os.path.join(root, "nx"), 0o600)  # no search: EACCES (as a user), even for nx/d


    def tree():
        found = []
        for dirpath, dirnames, filenames in os.walk(root):
            for name in sorted(dirnames + filenames):
                path = os.path.join(dirpath, name)
                try:
                    mode = oct(os.lstat(path).st_mode)
                except PermissionError:  # listed in a directory the caller may read but not search (nx)
                    mode = None
                found.append((os.path.relpath(path, root), mode))
        return sorted(found)


    PATHS = ["d", "new", "a/b/c", "f", "f/x", "m/x", "ld", "lf", "dl", "dl/x", "dl/x/y/z", "loop", "loop/x",
             "d/.", "n/.", "d/", "ro/d", "ro/new", "ro/new/x", "nx/d", "nx/new/x", ""]
    CASES = []
    # On a FUSE mount every case costs a round trip per call: one mode there (the guard never looks at it;
    # the local comparisons keep both).
    MODES = (0o777,) if os.environ.get("T_ONE_MODE") else (0o777, 0o700)
    for rel in PATHS:
        for mode in MODES:
            for exist_ok in (False, True):
                CASES.append(("makedirs", rel, mode, None, exist_ok, False))
                if rel:
                    CASES.append(("makedirs", rel, mode, None, exist_ok, True))  # bytes
                for parents in (False, True):
                    CASES.append(("mkdir", rel, mode, parents, exist_ok, False))


    def run(case, prepare=lambda: None):
        prepare()
        got = once(case)
        if took[-1][-1] > 1.0:  # slow: again, so that a stall of a loaded machine is not taken for a wait
            first = took[-1].pop()
            prepare()
            got = once(case)
            took[-1][-1] = min(first, took[-1][-1])
        return got


    def once(case):
        kind, rel, mode, parents, exist_ok, as_bytes = case
        build()
        path = os.path.join(root, rel) if rel else ""
        start = time.monotonic()
        try:
            if kind == "makedirs":
                os.makedirs(os.fsencode(path) if as_bytes else path, mode, exist_ok=exist_ok)
            else:
                pathlib.Path(path).mkdir(mode, parents=parents, exist_ok=exist_ok)
            outcome = ["ok"]
        except Exception as exc:
            outcome = [type(exc).__name__, getattr(exc, "errno", None), str(exc),
                       os.fsdecode(exc.filename) if getattr(exc, "filename", None) is not None else None,
                       getattr(exc, "filename2", None), list(getattr(exc, "__notes__", [])),
                       # the guard re-raises the standard library's own exception (bare raise); one it raised
                       # itself instead (a retry's) would come "from None"
                       exc.__suppress_context__]
        took[-1].append(time.monotonic() - start)
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


    took = [[]]  # seconds each case took, per implementation
    results = {"stdlib": [run(case) for case in CASES]}
    os.makedirs = naive(stdlib["makedirs"])
    took.append([])
    results["naive"] = [run(case) for case in CASES]
    os.makedirs = stdlib["makedirs"]

    from sharedfs.machinery import runtime
    from sharedfs.shims.makedirs import MakedirsShim

    shim = MakedirsShim()
    shim.patch(runtime.policy())  # SHAREDFS_WAIT_TIMEOUT as the environment says
    guarded = (os.makedirs, pathlib.Path.mkdir)
    took.append([])
    results["guarded"] = [run(case) for case in CASES]
    shim.unpatch()

    # What `import torch` puts in place (sharedfs.machinery.pending): stdlib-only guards that apply the
    # shim at their first error that could be its own.  Put back before every case, so each case meets them.
    from sharedfs.machinery import pending

    def pending_case(case):
        def reinstall():
            shim.unpatch()
            pending.withdraw()
            pending.install(lambda: shim.patch(runtime.policy()))
        return run(case, reinstall)

    took.append([])
    results["pending"] = [pending_case(case) for case in CASES]
    shim.unpatch()
    pending.withdraw()
    results["patched"] = [guarded[0] is not stdlib["makedirs"], guarded[1] is not stdlib["mkdir"]]
    results["restored"] = [os.makedirs is stdlib["makedirs"], pathlib.Path.mkdir is stdlib["mkdir"]]
    results["cases"] = [list(case) for case in CASES]
    results["took"] = dict(zip(["stdlib", "naive", "guarded", "pending"], took))
    os.chmod(os.path.join(root, "ro"), 0o755)
    os.chmod(os.path.join(root, "nx"), 0o755)
    from sharedfs.machinery import choices
    results["shared"] = choices.filesystem(root).shared
    print(json.dumps(results))
''')


def _compare(argv: list[str], root: Path, extra: dict[str, str] | None = None, **kwargs: object) -> dict:
    out = subprocess.run([*argv, "-c", COMPARE, str(root)], capture_output=True, text=True, timeout=900,
                         env=clean_env(extra), **kwargs)  # type: ignore[call-overload]
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
    with _reachable() as base, unixusers.throwaway_users(1) as (user,):
        work = base / "user"
        work.mkdir()
        os.chown(work, user.uid, user.gid)
        with unixusers.may_run_this_python(user, CHECKOUT, SITE):
            results = _compare([sys.executable], work / "tree", user=user.uid, group=user.gid, extra_groups=[],
                               start_new_session=True)
    _check(results, denied=True)


@contextmanager
def _reachable() -> Iterator[Path]:
    """A directory every user may traverse, outside pytest's own: a pytest session starting meanwhile
    chmods its base to 0700, which masks an ACL granting a throwaway user the way in."""
    base = Path(tempfile.mkdtemp(prefix="sharedfs-makedirs-", dir="/var/tmp" if os.path.isdir("/var/tmp") else None))
    base.chmod(0o755)
    try:
        yield base
    finally:
        for path in base.rglob("*"):  # the comparison's last tree may have left unsearchable directories
            if path.is_dir() and not path.is_symlink():
                path.chmod(0o755)
        shutil.rmtree(base, ignore_errors=True)


# On a filesystem the plugins classify as shared (hostilefs, honest passthrough: FUSE counts as shared) the
# guard is live: there it must still end as the standard library does, at the standard library's speed.  A
# wait is the guard's only way to differ in time; with SHAREDFS_WAIT_TIMEOUT=3 a case that waited takes 3 s.
WAIT = {"SHAREDFS_WAIT_TIMEOUT": "3"}
STOCK_SPEED = 1.0  # seconds: far below the wait, far above a passthrough mkdir


def _slow(results: dict, impl: str) -> list:
    return [(case, round(took, 2)) for case, took in zip(results["cases"], results["took"][impl]) if took > STOCK_SPEED]


def _check_shared(results: dict, *, denied: bool) -> None:
    assert results["shared"] is True  # the guard acts here (on a local disk it never waits)
    assert _slow(results, "stdlib") == []
    # Before: the dangling link as a parent (dl/x, dl/x/y/z: os.makedirs) waited the whole timeout for
    # FileNotFoundError, noting "dl became visible on this node, but mkdir kept failing".
    assert _slow(results, "guarded") == []
    assert _slow(results, "pending") == []
    _check(results, denied=denied)


def test_guard_on_a_shared_filesystem_fails_as_the_standard_library_at_its_speed(hostile_mount) -> None:
    mount = hostile_mount("plain")
    results = _compare([sys.executable], Path(mount.path) / "tree", {**WAIT, "T_ONE_MODE": "1"})
    _check_shared(results, denied=os.geteuid() != 0)


@contextmanager
def _reachable_mount() -> Iterator[hostilefs.HostileMount]:
    """A hostilefs mount in a directory every user may traverse (:func:`_reachable`)."""
    ok, reason = hostilefs.fuse_available()
    if not ok:
        skip_or_fail(f"FUSE unavailable: {reason}")
    with _reachable() as base:
        try:
            mount = hostilefs.mount(base / "backing", base / "mnt", "plain")
        except hostilefs.FuseUnavailable as exc:
            skip_or_fail(f"FUSE unavailable: {exc}")
        try:
            yield mount
        finally:
            mount.unmount()


def test_guard_on_a_shared_filesystem_fails_as_the_standard_library_at_its_speed_as_a_user() -> None:
    with _reachable_mount() as mount, unixusers.throwaway_users(1) as (user,):
        work = mount.backing / "user"  # seeded in the backing store: every node sees it at once
        work.mkdir()
        os.chown(work, user.uid, user.gid)
        with unixusers.may_run_this_python(user, CHECKOUT, SITE):
            results = _compare([sys.executable], Path(mount.path) / "user" / "tree", {**WAIT, "T_ONE_MODE": "1"},
                               user=user.uid,
                               group=user.gid, extra_groups=[], start_new_session=True)
    _check_shared(results, denied=True)


LONGER_WAIT = {"SHAREDFS_WAIT_TIMEOUT": "6"}
AFTERWARDS = textwrap.dedent(r'''
    import json, os, pathlib, shutil, sys, threading, time

    root, impl = sys.argv[1], sys.argv[2]
    if impl != "stdlib":
        from sharedfs.machinery import runtime
        from sharedfs.shims.makedirs import MakedirsShim
        MakedirsShim().patch(runtime.policy())
    seen = {}


    def outcome(call):
        start = time.monotonic()
        try:
            call()
            got = ["ok"]
        except OSError as exc:
            got = [type(exc).__name__, exc.errno, os.fsdecode(exc.filename), list(getattr(exc, "__notes__", []))]
        return got, time.monotonic() - start


    # An exist_ok=False FileExistsError the caller handled, other calls that succeed, the directory removed:
    # a later, unrelated mkdir below it is a plain missing parent.
    d = os.path.join(root, "d")
    os.makedirs(d)
    try:
        os.makedirs(d)
    except FileExistsError:
        pass
    os.makedirs(os.path.join(root, "other", "x"), exist_ok=True)
    pathlib.Path(root, "third").mkdir()
    os.rmdir(d)
    seen["stale Path.mkdir"] = outcome(lambda: pathlib.Path(d, "x").mkdir())
    try:
        os.makedirs(os.path.join(root, "again"))
        os.makedirs(os.path.join(root, "again"))
    except FileExistsError:
        pass
    os.rmdir(os.path.join(root, "again"))
    seen["stale makedirs below"] = outcome(lambda: pathlib.Path(root, "again", "x", "y").mkdir())

    # Six threads make the same deep tree at once, exist_ok False and True, os.makedirs and Path.mkdir.
    for kind in ("os", "pathlib"):
        for exist_ok in (False, True):
            top = os.path.join(root, f"threads-{kind}-{exist_ok}")
            barrier = threading.Barrier(6)
            got = []

            def make(top=top, kind=kind, exist_ok=exist_ok, barrier=barrier, got=got):
                barrier.wait()
                target = os.path.join(top, "a", "b", "c")
                if kind == "os":
                    got.append(outcome(lambda: os.makedirs(target, exist_ok=exist_ok)))
                else:
                    got.append(outcome(lambda: pathlib.Path(target).mkdir(parents=True, exist_ok=exist_ok)))

            threads = [threading.Thread(target=make) for _ in range(6)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            seen[f"6 threads {kind} exist_ok={exist_ok}"] = (sorted(g for g, _ in got), max(t for _, t in got))
    print(json.dumps(seen))
''')


def _afterwards(root: Path, impl: str) -> dict:
    root.mkdir()
    out = subprocess.run([sys.executable, "-c", AFTERWARDS, str(root), impl], capture_output=True, text=True,
                         timeout=300, env=clean_env(LONGER_WAIT))
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_an_exist_ok_false_error_the_caller_handled_is_forgotten_when_the_call_ends(hostile_mount) -> None:
    """The guard remembers an ancestor's EEXIST for the one os.makedirs call that swallows it, never longer:
    before, a FileExistsError the caller handled made a later, unrelated mkdir below that (since removed)
    directory wait the whole SHAREDFS_WAIT_TIMEOUT.  Six threads making one tree end as without sharedfs."""
    mount = hostile_mount("plain")
    stock = _afterwards(Path(mount.path) / "stock", "stdlib")
    guarded = _afterwards(Path(mount.path) / "guarded", "guarded")
    print("stock:", json.dumps(stock))
    print("guarded:", json.dumps(guarded))
    assert stock["stale Path.mkdir"][0][0] == "FileNotFoundError", stock
    for name, (want, took) in stock.items():
        got, guarded_took = guarded[name]
        # One try each (the steps build on each other): the bar is half a wait that takes 6 s, not a second.
        assert took < 3.0 and guarded_took < 3.0, (name, took, guarded_took)
        assert json.dumps(got).replace("/guarded/", "/stock/") == json.dumps(want), (name, want, got)

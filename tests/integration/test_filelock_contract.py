"""Drop-in means identical: what sharedfs hands a framework in place of its filelock class keeps filelock's contract.

The same assertions (tests/helpers/contract_checks.py: non-blocking and zero-timeout acquires return at
once, a negative timeout waits, the error is a picklable ``filelock.Timeout`` with
``.lock_file``, per-thread re-entrancy, ``with lock.acquire():`` releases, ``release(force=True)``,
``mode``, ``timeout``, constructor options) run against the stock class (``SHAREDFS_DISABLE=1``)
and against sharedfs's replacement, for filelock itself, ``sharedfs.lock``, datasets' FileLock
and the class huggingface_hub's WeakFileLock builds.  sharedfs 0.1's facade failed five of them
(blocking=False waited out the timeout, its error was no filelock.Timeout, threads shared a hold,
``with lock.acquire():`` left the lock held, and timeout/mode/lock_counter were missing).

Four more came from running filelock's own test suite against the drop-in (tests/upstream/run.py,
suite ``filelock``); sharedfs before 0.2 failed each of them where the stock class passes: a
KeyboardInterrupt (a raising signal handler) in release() left the lock held for the life of the
process, one in acquire() could leave a hold nobody knew of, the Timeout's message was not
filelock's, and with filelock 3.x a lock in a directory that did not exist yet waited forever
(filelock 3.x creates it in the ``_acquire`` sharedfs replaces).

Two more came with filelock 4.3.1's suite (tests/core, tests/native), where the drop-in failed
four tests the stock class passes: after a release() whose unlock raised, acquire() on the same
object nested into a hold the kernel may already have dropped (filelock 4.3 refuses until
release() is retried, tox-dev/filelock#1098), and an ``on_acquired`` callback was handed a lock
file hard-linked, in a directory others can write, to another file it then wrote into (filelock
4.3 refuses it, tox-dev/filelock#1118; sharedfs does so on every filelock that has the callback).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import HELPERS, clean_env
from packaging.version import Version

CHECKS = str(HELPERS / "contract_checks.py")


def upstream_breaks(which: str) -> set[str]:
    """The checks the framework's own class fails with the filelock installed: the replacement must fail them too.

    filelock < 3.30 hands a subclass whose ``__init__`` takes ``**kwargs`` none of the lock options
    (filelock#628, fixed in 3.30.0), and datasets' FileLock is one (datasets#8637): its
    ``timeout=``, ``mode=``, ``thread_local=`` and ``blocking=`` are silently dropped.
    """
    import filelock

    breaks = set()
    if which == "datasets":
        # datasets' FileLock statvfs()es the lock's directory in its constructor (to hash names too
        # long for it), so a lock in a directory that does not exist yet fails before filelock runs.
        breaks.add("check_a_missing_directory_is_created")
        if Version(filelock.__version__) < Version("3.30"):
            breaks.add("check_properties_and_constructor_options")
    if Version(filelock.__version__) < Version("4"):
        # filelock 3.x's release() counts the hold down before _release() runs: after an interrupt
        # there, a retried release() finds the count at zero and never unlocks (seen on 3.19 and 3.23).
        breaks.add("check_release_interrupted_anywhere_then_retried_frees_the_lock")
    if Version(filelock.__version__) >= Version("4") and not hasattr(
            type(filelock.FileLock(os.devnull)._context), "unlock_uncertain"):
        # filelock 4.0 to 4.2 clear the descriptor after unlocking: an error in between leaves the object
        # reporting the hold, and acquire() nests into it while another lock object can take the lock
        # (4.3 refuses, tox-dev/filelock#1098).  3.x forgets the descriptor before unlocking: no such gap.
        breaks.add("check_a_release_that_raised_never_nests_into_a_lock_others_can_take")
    return breaks | newer_contract(which)


def newer_contract(which: str) -> set[str]:
    """Checks the stock class fails only because the installed filelock predates a fix that sharedfs's
    replacement applies on every filelock: the replacement passes them.

    filelock 3.30 to 4.2 hand ``on_acquired`` a lock file hard-linked to another file in a directory
    others can write (4.3 refuses it, tox-dev/filelock#1118); before 3.30 there is no callback.
    """
    import filelock

    if Version("3.30") <= Version(filelock.__version__) < Version("4.3"):
        return {"check_on_acquired_is_never_handed_a_hard_link_others_could_plant"}
    return set()


def failed(results: dict) -> set[str]:
    return {name for name, result in results["results"].items() if result != "ok"}


def run(which: str, tmp_path: Path, **env: str) -> dict:
    work = tmp_path / f"{which}-{'stock' if env.get('SHAREDFS_DISABLE') else 'sharedfs'}-{env.get('SHAREDFS_LOCK', '')}"
    work.mkdir()
    proc = subprocess.run([sys.executable, CHECKS, which, str(work)], capture_output=True, text=True,
                          env=clean_env(env), timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize("which", ["datasets", "huggingface_hub"])
def test_the_framework_class_and_its_replacement_pass_the_same_contract(tmp_path: Path, which: str) -> None:
    stock = run(which, tmp_path, SHAREDFS_DISABLE="1")
    replaced = run(which, tmp_path)
    assert not stock["class"].startswith("sharedfs") and replaced["class"].startswith("sharedfs.shims.")
    assert failed(stock) == upstream_breaks(which), stock  # the library defines the contract ...
    # ... and the replacement keeps it (drop-in means identical), in the newest filelock's words.
    assert failed(replaced) == failed(stock) - newer_contract(which), replaced


@pytest.mark.parametrize("kind", ["auto", "posix", "soft"])
def test_sharedfs_lock_passes_filelocks_contract(tmp_path: Path, kind: str) -> None:
    # Each kind releases in its own steps (a POSIX lock's in-process guard once stayed taken after an
    # interrupted release); "auto" is flock on this local disk.
    stock = run("filelock", tmp_path, SHAREDFS_DISABLE="1")
    ours = run("sharedfs", tmp_path, SHAREDFS_LOCK=kind)
    assert failed(stock) == upstream_breaks("filelock"), stock
    assert failed(ours) == failed(stock) - newer_contract("filelock"), ours
    assert ours["class"] == "sharedfs.locks._api.SharedFSLock"


def test_the_checks_catch_a_lock_that_breaks_the_contract(tmp_path: Path) -> None:
    broken = run("filelock-threads-share", tmp_path, SHAREDFS_DISABLE="1")
    # What filelock itself fails with this release, plus the one check this lock breaks.
    assert failed(broken) == upstream_breaks("filelock") | {"check_threads_do_not_share_a_hold_by_default"}

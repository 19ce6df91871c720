"""A lock file torch without sharedfs polls is never missing while a dead sharedfs builder's is replaced.

torch < 2.14 waits for another builder in ``FileBaton.wait()``: it polls ``exists(<build_dir>/lock)``
every 0.1 s and, once the file is gone, *loads* the extension without building it.  A sharedfs
builder SIGKILLed half-way leaves its baton (with its holder record) and an unfinished build;
torch without sharedfs (another environment, or ``SHAREDFS_DISABLE=1``) alone waits for it forever
and never loads a partial file.  The next sharedfs builder knows the baton's builder is gone and
takes the baton over.  If it removed the dead baton and then created its own, a stock waiter
polling in between would see no lock and load what the dead builder left (a module the linker
had half written: SIGBUS).  sharedfs replaces it in one ``rename(2)`` (``sharedfs.fs.polledfile.replace_foreign``,
the one rule for foreign lock files, which torch >= 2.14's existence lock file on a flock-less
filesystem shares), so no poller ever sees it absent.

The evidence is counted, not raced: a poller process looks at the baton's name through the
mount (what torch sees, 20 ms per lookup as on a loaded metadata server) and at the backing
directory (every few milliseconds), from the dead builder's baton to the new builder's release.
Through the mount it looks the name up (``open(O_PATH)``) rather than ``stat`` it: a path-based FUSE
daemon (libfuse's high-level API, which hostilefs uses) answers the ``GETATTR`` of a stat that
reached the inode a rename has just replaced with ENOENT, as it cannot name an inode it unlinked,
so a stat there finds a plain ``rename(2)`` "missing" about once per rename.  No kernel filesystem
does: a local one answers with the old inode, NFS answers ESTALE and the kernel looks the name up
again (``retry_estale``).
First the takeover sharedfs did before the rule (remove, then create: the poller sees the name
absent, and the stock waiter loads the half-written module and dies), then sharedfs's own (never
absent; the stock waiter loads the extension the new builder finished).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from harness.skips import skip_or_fail
from helpers import clean_env, require

from sharedfs.demo.scenario_torch import (
    EXTENSION,
    SOURCE,
    Toolchain,
    ToolchainMissing,
    answer,
    builds_under_filelock,
    finish,
    kill_mid_build,
    run_load,
    toolchain,
)

pytestmark = pytest.mark.slow
require("torch", "the torch shims are tested against real torch")

if builds_under_filelock():  # torch >= 2.14 has no FileBaton; its lock file's takeover: test_torch.py's mixed case
    pytest.skip("torch >= 2.14 builds under filelock, not a FileBaton (covered by test_torch.py's mixed-environment "
                "test on lustre-noflock)", allow_module_level=True)

#: Until the stop file exists: how often each name was looked at, and how often it was found missing and then
#: there again (a gap in which a poller finds the lock free; its release at the end is no gap).
POLLER = textwrap.dedent("""
    import json, os, sys, threading, time
    mount, backing, stop = sys.argv[1:4]
    seen = {"mount": [0, 0, 0], "backing": [0, 0, 0]}
    why = {"mount": [], "backing": []}  # the errno of each missed look (torch's exists() is False on any error)
    def poll(key, path, pause):
        absent = 0
        while not os.path.exists(stop):
            seen[key][0] += 1
            try:
                if key == "mount":  # a lookup: see the module's docstring (libfuse's stat of a replaced inode)
                    os.close(os.open(path, os.O_PATH | os.O_NOFOLLOW))
                else:
                    os.lstat(path)
            except OSError as exc:
                why[key].append(exc.errno)
                absent += 1
            else:
                if absent:
                    seen[key][1] += 1
                    seen[key][2] += absent
                    absent = 0
            time.sleep(pause)
    threads = [threading.Thread(target=poll, args=("mount", mount, 0.0)),
               threading.Thread(target=poll, args=("backing", backing, 0.002))]
    for t in threads: t.start()
    print("polling", flush=True)
    for t in threads: t.join()
    print(json.dumps({k: {"looks": v[0], "gaps": v[1], "absent": v[2], "errnos": sorted(set(why[k]))}
                      for k, v in seen.items()}), flush=True)
""")

#: A stock load() (SHAREDFS_DISABLE=1) that says when it is about to wait for the baton.
STOCK_WAITER = textwrap.dedent("""
    import json, sys
    from torch.utils.cpp_extension import load
    print("loading", flush=True)
    module = load(sys.argv[1], [sys.argv[2]], verbose=False)
    print(json.dumps({"answer": module.answer(), "seconds": 0}), flush=True)
""")

#: A sharedfs builder whose takeover of a dead builder's baton is the one sharedfs had before the rule for
#: foreign lock files: remove the dead baton, then create its own.
REMOVE_THEN_CREATE = textwrap.dedent("""
    import json, sys
    from torch.utils.cpp_extension import load
    from sharedfs.fs.polledfile import create_whole, read_with_identity
    from sharedfs.fs.recordfile import unlink_if_same
    from sharedfs.locks.names import TORCH_BATON_KIND
    from sharedfs.locks.torchbaton import SharedFSBaton
    from sharedfs.types import HolderRecord

    def remove_then_create(self, record):
        seen = read_with_identity(self.lock_file_path)
        if seen is None:
            return None
        data, identity = seen
        left = HolderRecord.parse(data) if data else None
        if left is None or left.kind != TORCH_BATON_KIND:
            return None
        unlink_if_same(self.lock_file_path, identity)
        return create_whole(self.lock_file_path, record)

    SharedFSBaton._take_over_from_dead_sharedfs_builder = remove_then_create
    module = load(sys.argv[1], [sys.argv[2]], verbose=False)
    print(json.dumps({"answer": module.answer(), "seconds": 0}), flush=True)
""")


@pytest.fixture
def chain(tmp_path: Path) -> Toolchain:
    try:
        return toolchain(tmp_path)
    except ToolchainMissing as exc:
        skip_or_fail(str(exc))


def _start(script: str, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", script, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, cwd="/")


def _first_line(proc: subprocess.Popen[str], expected: str) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line == expected, (line, proc.stderr.read() if proc.poll() is not None and proc.stderr else "")


def _recover(chain: Toolchain, root: Path, backing: Path, recovery: str | None, tmp: Path,
             truncated: bytes) -> dict[str, object]:
    """Kill a sharedfs builder half-way in ``root``, then let ``recovery`` (a script; ``None``: sharedfs) rebuild
    while a stock load() waits and a poller watches the baton.  What the poller, the waiter and the builder saw.

    The killed build leaves ``truncated`` as its module, as a builder killed while the linker wrote it does."""
    kill_mid_build(chain, chain.env(clean_env(), root))
    (root / EXTENSION / f"{EXTENSION}.so").write_bytes(truncated)
    baton = root / EXTENSION / "lock"
    backing_baton = backing / root.name / EXTENSION / "lock"
    assert baton.exists() and backing_baton.exists(), "the killed sharedfs builder leaves its baton"
    stop = tmp / f"stop-{root.name}"
    poller = _start(POLLER, clean_env({"SHAREDFS_DISABLE": "1"}), str(baton), str(backing_baton), str(stop))
    waiter = _start(STOCK_WAITER, chain.env(clean_env({"SHAREDFS_DISABLE": "1"}), root), EXTENSION, str(SOURCE))
    try:
        _first_line(poller, "polling")
        _first_line(waiter, "loading")
        # torch alone: the waiter waits for the dead builder's baton (forever, test_torch.py shows), loads nothing.
        time.sleep(2.0)
        assert waiter.poll() is None, waiter.communicate()
        script = REMOVE_THEN_CREATE if recovery is not None else STOCK_WAITER.replace('print("loading", flush=True)',
                                                                                     "")
        builder = subprocess.run([sys.executable, "-c", script, EXTENSION, str(SOURCE)], capture_output=True,
                                 text=True, env=chain.env(clean_env(), root), timeout=180, cwd="/")
        stop.touch()
        polled = json.loads(poller.communicate(timeout=60)[0].strip().splitlines()[-1])
        waited = finish(waiter, 120)
    finally:
        stop.touch()
        for proc in (poller, waiter):
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return {"polled": polled, "builder": answer(builder), "builder_err": builder.stderr[-2000:],
            "waiter": answer(waited), "waiter_rc": None if waited is None else waited.returncode,
            "waiter_err": "" if waited is None else waited.stderr[-2000:]}


@pytest.mark.long
def test_a_dead_sharedfs_builders_baton_is_replaced_without_a_moment_in_which_stock_torch_sees_it_free(
    tmp_path: Path, chain: Toolchain, hostile_mount
) -> None:
    complete = run_load(chain.env(clean_env(), tmp_path / "complete"), 180)
    assert answer(complete) == {"answer": 42, "seconds": answer(complete)["seconds"]}, complete  # type: ignore[index]
    built = (tmp_path / "complete" / EXTENSION / f"{EXTENSION}.so").read_bytes()
    truncated = built[:len(built) // 2]
    compiled = chain.compiles()

    mount = hostile_mount("plain", latency_ms=20)
    before = _recover(chain, mount.path / "remove-then-create", mount.backing, "remove-then-create", tmp_path,
                      truncated)
    assert before["builder"] == {"answer": 42, "seconds": 0}, before
    # The window: the name was missing between the dead baton and the new one (the backing poller looks every
    # few ms; the gap is at least a create and a link, 20 ms each).
    assert before["polled"]["backing"]["gaps"] == 1, before  # type: ignore[index]
    # ... long enough (a create, a write and a link through the metadata server) for the stock waiter, which looks
    # every 0.1 s, to find the lock free and load the half-written module the dead builder left: it dies (SIGBUS
    # here, -7; another loader may raise ImportError instead), where torch alone would have waited.
    assert before["waiter"] is None and before["waiter_rc"] not in (None, 0), before

    print("remove, then create:", json.dumps(before))
    assert chain.compiles() == compiled + 2, "each killed build compiled once, and so did its rebuild"
    after = _recover(chain, mount.path / "sharedfs", mount.backing, None, tmp_path, truncated)
    assert after["builder"] is not None and after["builder"]["answer"] == 42, after  # type: ignore[index]
    polled = after["polled"]
    assert polled["backing"]["gaps"] == 0 and polled["mount"]["gaps"] == 0, after  # type: ignore[index]
    assert polled["backing"]["looks"] > 100 and polled["mount"]["looks"] > 20, after  # type: ignore[index]
    print("one rename:", json.dumps(after))
    # The stock waiter saw the baton only when the new builder released it, and loaded the finished extension.
    assert after["waiter"] is not None and after["waiter"]["answer"] == 42, after  # type: ignore[index]


# -- what `sharedfs locks` says of such a baton ----------------------------------------------------------


def _locks(*args: str) -> list[dict[str, Any]]:
    done = subprocess.run([sys.executable, "-m", "sharedfs", "locks", "--json", *args], capture_output=True,
                          text=True, timeout=120, env=clean_env())
    assert done.returncode in (0, 1), done.stderr  # 0: nothing held, 1: something held or undecidable
    rows: list[dict[str, Any]] = json.loads(done.stdout)
    return rows


def _baton_rows(rows: list[dict[str, Any]], baton: Path) -> list[dict[str, Any]]:
    return [row for row in rows if row["file"] == str(baton)]


def test_sharedfs_locks_names_a_dead_sharedfs_builders_baton_keeps_it_and_the_next_build_replaces_it(
    tmp_path: Path, chain: Toolchain
) -> None:
    """``sharedfs locks`` reads the baton as the torch shim writes it (its name, the sharedfs lock beside it and
    its record's kind: one definition, ``sharedfs.locks.names``).  torch without sharedfs leaves an empty baton
    nobody can judge; a sharedfs builder's is named as a dead builder's and kept by ``--clear-dead`` (a poller
    would take its absence for a finished build), and the next build replaces it."""
    # torch without sharedfs: the killed builder's baton is empty, and nothing says whose it is.
    stock = tmp_path / "stock"
    kill_mid_build(chain, chain.env(clean_env({"SHAREDFS_DISABLE": "1"}), stock))
    stock_baton = stock / EXTENSION / "lock"
    assert stock_baton.exists() and stock_baton.read_bytes() == b""
    rows = _locks(str(stock))
    assert all(row["holder"] is None and row["state"] != "dead" for row in _baton_rows(rows, stock_baton)), rows

    # With sharedfs: the baton holds the builder's record, which the command reads as torch's baton of a dead
    # sharedfs builder (the same kind the shim wrote), beside the sharedfs lock the builder held.
    root = tmp_path / "sharedfs"
    pid = kill_mid_build(chain, chain.env(clean_env(), root))
    baton = root / EXTENSION / "lock"
    assert (root / EXTENSION / "lock.sharedfs").exists() or (root / EXTENSION / "lock.sharedfs.held").exists()
    rows = _locks(str(root))
    [row] = _baton_rows(rows, baton)
    assert (row["kind"], row["state"]) == ("torch-baton", "dead"), rows
    assert row["holder"]["pid"] == pid and row["holder"]["lock_kind"] == "torch-baton", row
    assert "never removed here" in row["evidence"], row

    # --clear-dead keeps it: torch without sharedfs may be polling that name, and its absence means "built".
    _locks("--clear-dead", str(root))
    assert baton.exists()

    # The next sharedfs build takes it over (one rename), finishes the build and releases it.
    assert answer(run_load(chain.env(clean_env(), root), 180)) is not None
    assert not baton.exists()
    rows = _locks(str(root))
    assert _baton_rows(rows, baton) == [], rows

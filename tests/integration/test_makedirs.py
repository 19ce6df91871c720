"""The makedirs shim on a filesystem that hides one node's new directories from the others (hostilefs ``lagging``).

The programs are the frameworks' own code paths, unchanged and without a ``sharedfs.`` call
(:mod:`sharedfs.demo.scenario_makedirs`): lingua's ``CheckpointManager`` and
``maybe_run_profiler`` (lingua#49) and torch DCP's ``save`` over gloo (pytorch#92553), six ranks
on three simulated nodes.  Each test runs them first with ``SHAREDFS_DISABLE=1``, where they fail,
then with sharedfs, where every rank succeeds.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import clean_env
from helpers.shardcache_support import sharedfs_at

from sharedfs.demo import scenario_makedirs

pytestmark = pytest.mark.slow

LAG_MS = 3000
#: sharedfs before the guard backed off on a directory a listing showed and a lookup then missed.
BEFORE = "d5a2ac8"


def test_lingua_and_torch_dcp_fail_on_a_lagging_filesystem_without_sharedfs_and_not_with_it(hostile_mount) -> None:
    mount = hostile_mount("lagging", lag_ms=LAG_MS)
    shared = Path(mount.path)

    stock = scenario_makedirs.run_ranks(shared, "stock", clean_env({"SHAREDFS_DISABLE": "1"}))
    counts = scenario_makedirs.tally(stock)
    print("SHAREDFS_DISABLE=1:", scenario_makedirs.evidence(stock))
    for name in ("lingua CheckpointManager", "lingua maybe_run_profiler"):
        ok, _ = counts[name]
        # Node n0 made the directories, so its two ranks see them; the other nodes' four do not.
        assert ok == 2, (name, stock)
        failures = [r[name] for r in stock[2:]]
        assert all(f.startswith(("FileNotFoundError", "FileExistsError")) for f in failures), failures
    ok, failure = counts["torch DCP save"]
    assert ok == 0 and "CheckpointException" in failure and "FileExistsError" in failure, stock

    fixed = scenario_makedirs.run_ranks(shared, "sharedfs", clean_env({"SHAREDFS_WAIT_TIMEOUT": "120"}))
    print("with sharedfs:", scenario_makedirs.evidence(fixed))
    assert fixed == [{name: "ok" for name in scenario_makedirs.STEPS}] * 6, fixed
    # The checkpoint is whole: rank 0 wrote its metadata after every rank wrote into the directory.
    assert (mount.backing / "sharedfs-dcp" / ".metadata").is_file()
    assert sorted(p.name for p in (mount.backing / "sharedfs").iterdir()) == ["checkpoints", "profiling"]


MADE_ELSEWHERE = textwrap.dedent("""
    import json, os, sys, time
    import torch.distributed  # the shim's target (every multi-rank program imports it)
    target, kind = sys.argv[1], sys.argv[2]
    try:
        if kind == "os":
            os.makedirs(target, exist_ok=True)
        elif kind == "os, exist_ok=False":
            os.makedirs(target)
        else:
            import pathlib
            pathlib.Path(target).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(json.dumps({"type": type(exc).__name__, "str": str(exc), "notes": getattr(exc, "__notes__", [])}))
    else:
        print(json.dumps({"type": "ok", "isdir": os.path.isdir(target)}))
""")


def _other_node(target: Path, kind: str, extra: dict[str, str], cwd: Path | None = None) -> dict:
    """``cwd``: where ``python -c`` runs, first on its sys.path (an old checkout's; never this checkout's root)."""
    out = subprocess.run([sys.executable, "-c", MADE_ELSEWHERE, str(target), kind], capture_output=True, text=True,
                         timeout=300, env=clean_env({"SHAREDFS_NODE_ID": "n1", **extra}), cwd=cwd)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(("kind", "relative"), [("os", "run"), ("pathlib", "run"), ("os", "run/sub/deeper"),
                                                ("pathlib", "run/sub/deeper")])
def test_a_wait_that_times_out_raises_the_callers_exception_saying_what_to_raise(hostile_mount, kind: str,
                                                                                 relative: str) -> None:
    """On timeout the caller still gets its exception (its except clauses expect that type), with one note naming
    the setting: one wait per call, however deep the path (each level of Path.mkdir sees the parent's error)."""
    mount = hostile_mount("lagging", lag_ms=60_000)  # longer than the wait: the directory stays hidden
    (Path(mount.path) / "run").mkdir()  # made by this process: node "local", not n1

    stock = _other_node(Path(mount.path) / relative, kind, {"SHAREDFS_DISABLE": "1"})
    expected = "FileNotFoundError" if (kind, relative) == ("os", "run/sub/deeper") else "FileExistsError"
    assert stock["type"] == expected and stock["notes"] == [], stock

    waited = _other_node(Path(mount.path) / relative, kind, {"SHAREDFS_WAIT_TIMEOUT": "1"})
    assert waited["type"] == expected and waited["str"] == stock["str"], waited
    (note,) = waited["notes"]
    assert "answered EEXIST but the directory stayed invisible on this node" in note, note
    assert "raise SHAREDFS_WAIT_TIMEOUT" in note and "on node n1" in note, note


def test_a_parent_another_node_just_made_is_waited_for_inside_os_makedirs_with_exist_ok_false(hostile_mount) -> None:
    """``os.makedirs(run/sub)``, ``run`` just made on another node: os.makedirs swallows the parent's EEXIST
    (``exist_ok=False`` is passed down) and fails on ``sub`` with FileNotFoundError; the guard waits for the
    parent it swallowed instead (the only lag the child's error can be), and the call makes ``sub``."""
    # Stock: a lag longer than the child can take to start on a loaded machine (a 3 s lag could end first).
    hidden = hostile_mount("lagging", lag_ms=60_000)
    (Path(hidden.path) / "run").mkdir()  # made by this process: node "local", not n1
    stock = _other_node(Path(hidden.path) / "run" / "sub", "os, exist_ok=False", {"SHAREDFS_DISABLE": "1"})
    assert stock["type"] == "FileNotFoundError" and stock["notes"] == [], stock
    mount = hostile_mount("lagging", lag_ms=LAG_MS)  # with the guard: a lag it waits out
    (Path(mount.path) / "again").mkdir()
    guarded = _other_node(Path(mount.path) / "again" / "sub", "os, exist_ok=False", {"SHAREDFS_WAIT_TIMEOUT": "120"})
    assert guarded == {"type": "ok", "isdir": True}, guarded


@pytest.mark.parametrize("kind", ["os", "pathlib"])
def test_a_regular_file_in_the_way_on_a_shared_filesystem_fails_at_once_as_without_sharedfs(hostile_mount,
                                                                                             kind: str) -> None:
    mount = hostile_mount("lagging", lag_ms=LAG_MS)
    (mount.backing / "run").write_text("not a directory")  # in the backing store: every node sees it at once
    stock = _other_node(Path(mount.path) / "run", kind, {"SHAREDFS_DISABLE": "1"})
    guarded = _other_node(Path(mount.path) / "run", kind, {"SHAREDFS_WAIT_TIMEOUT": "120"})
    assert stock["type"] == "FileExistsError" and guarded == stock, (stock, guarded)  # no wait, no note


SWITCHES = textwrap.dedent("""
    import json, os, pathlib, sys, tempfile
    stdlib = (os.makedirs, pathlib.Path.mkdir)
    import torch  # imports torch.distributed
    seen = {"guarded": [os.makedirs is not stdlib[0], pathlib.Path.mkdir is not stdlib[1]],
            "loaded at import": "sharedfs.startup.activation" in sys.modules}
    with tempfile.NamedTemporaryFile() as fh:  # a regular file in the way: an error the guard could be for
        try:
            os.makedirs(fh.name, exist_ok=True)
        except FileExistsError:
            pass
    seen["loaded at first error"] = "sharedfs.startup.activation" in sys.modules
    seen["guard of the shim"] = os.makedirs.__code__.co_filename.endswith("shims/makedirs.py")
    import sharedfs
    sharedfs.disable()
    seen["restored"] = [os.makedirs is stdlib[0], pathlib.Path.mkdir is stdlib[1]]
    print(json.dumps(seen))
""")


def test_import_torch_guards_without_loading_sharedfs_and_disable_opts_out_and_unpatch_restores_the_stdlib() -> None:
    """``import torch`` puts the pending guards in place (stdlib only: sharedfs itself is not loaded); their first
    error that could be the shim's loads it and applies the shim; ``sharedfs.disable()`` restores the stdlib."""
    def run(extra: dict[str, str]) -> dict:
        out = subprocess.run([sys.executable, "-c", SWITCHES], capture_output=True, text=True, timeout=300,
                             env=clean_env(extra))
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    assert run({}) == {"guarded": [True, True], "loaded at import": False, "loaded at first error": True,
                       "guard of the shim": True, "restored": [True, True]}
    for value in ("makedirs", "1"):
        off = run({"SHAREDFS_DISABLE": value})
        assert off["guarded"] == [False, False] and not off["guard of the shim"], (value, off)

    status = subprocess.run([sys.executable, "-m", "sharedfs", "status", "--json"], capture_output=True, text=True,
                            timeout=120, env=clean_env())
    row = next(s for s in json.loads(status.stdout)["shims"] if s["name"] == "makedirs")
    assert row["target"] == "torch.distributed" and row["distribution"] is None, row
    assert row["supported_versions"] == ">=3.9,<3.14" and row["supported"] is True and row["enabled"], row
    off = subprocess.run([sys.executable, "-m", "sharedfs", "status", "--json"], capture_output=True, text=True,
                         timeout=120, env=clean_env({"SHAREDFS_DISABLE": "makedirs"}))
    assert "makedirs" in json.loads(off.stdout)["blocked"]


def test_any_other_shim_applies_the_guard_without_torch() -> None:
    """datasets does not import torch.distributed; its shim's activation applies the guard with it."""
    pytest.importorskip("datasets")
    code = ("import json, os, sys; stdlib = os.makedirs; import datasets; "
            "print(json.dumps([os.makedirs is not stdlib, 'torch.distributed' in sys.modules]))")
    for extra, patched in (({"SHAREDFS_DISABLE": "makedirs"}, False), ({}, True)):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                             env=clean_env(extra))
        assert out.returncode == 0, out.stderr[-3000:]
        assert json.loads(out.stdout.strip().splitlines()[-1]) == [patched, False], extra


def test_a_directory_a_listing_shows_and_a_lookup_then_misses_is_waited_for_not_raised(hostile_mount,
                                                                                      tmp_path: Path) -> None:
    """MooseFS's client answers a lookup from its negative-entry cache after a listing of the parent showed the
    name (hostilefs ``flapping``): ``mkdir`` says EEXIST, ``isdir`` says no.  Stock ``os.makedirs(exist_ok=True)``
    raises; sharedfs before (``BEFORE``) re-listed the parent, saw the name, took the next "not a directory" for
    the standard library's answer and raised too (a torch.hub rank on MooseFS, in a CI run).  Now the guard
    backs off while listings show the name and lookups miss it, and the call succeeds once the lag passes."""
    hidden = hostile_mount("flapping", lag_ms=60_000)  # longer than any child's start: only the guard can pass
    for label in ("stock", "before"):
        (Path(hidden.path) / label).mkdir()  # made by this process: node "local", not n1
    stock = _other_node(Path(hidden.path) / "stock", "os", {"SHAREDFS_DISABLE": "1"})
    assert stock["type"] == "FileExistsError" and stock["notes"] == [], stock
    old_code = sharedfs_at(BEFORE, tmp_path / "before")
    old = _other_node(Path(hidden.path) / "before", "os", {**old_code, "SHAREDFS_WAIT_TIMEOUT": "120"},
                      cwd=Path(old_code["PYTHONPATH"]))
    assert old["type"] == "FileExistsError" and old["notes"] == [], old  # gave up at once, without a note
    mount = hostile_mount("flapping", lag_ms=15_000)  # with the guard: a lag it waits out
    (Path(mount.path) / "now").mkdir()
    guarded = _other_node(Path(mount.path) / "now", "os", {"SHAREDFS_WAIT_TIMEOUT": "120"})
    assert guarded == {"type": "ok", "isdir": True}, guarded

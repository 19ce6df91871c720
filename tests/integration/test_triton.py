"""Triton's kernel cache shared by many processes on several nodes: real triton 3.9.0, no GPU needed.

Every test runs Triton's own cache API (``triton.runtime.cache.get_cache_manager``, as
``triton.compiler.compile`` uses it) in separate processes, first with ``SHAREDFS_DISABLE=1``
(Triton's ``FileCacheManager``: the failure), then with sharedfs autoloaded (its absence).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import clean_env, require

from sharedfs.demo import scenario_triton
from sharedfs.demo.nodes import NodeProcess

require("triton", "needs triton==3.9.0 (scripts/requirements-test.txt)")

pytestmark = pytest.mark.slow

LAG_MS = 2000
NODES = {"n0": 3, "n1": 3, "n2": 3}
SHAREDFS_MANAGER = "sharedfs.shims.triton.SharedFSFileCacheManager"


def test_nine_processes_on_three_lagging_nodes_fail_with_tritons_manager_and_never_with_sharedfs(
        hostile_mount) -> None:
    """A node that cannot see another node's new key directory yet: ``FileCacheManager(key)``'s
    ``os.makedirs(<key>, exist_ok=True)`` and ``put``'s temp directory raise (the NFS failures of
    triton#2688 and prime-rl PR #2305's home cache); with sharedfs, 0 failures over three trials."""
    mount = hostile_mount("lagging", lag_ms=LAG_MS)
    shared = Path(mount.path)

    stock = scenario_triton.run(shared / "stock", NODES, clean_env({"SHAREDFS_DISABLE": "1"}))
    errors = scenario_triton.first_errors(stock)
    print("SHAREDFS_DISABLE=1:", scenario_triton.failed(stock), "of", len(stock), "processes failed;", errors[:3])
    assert {r["manager"] for r in stock} <= {"triton.runtime.cache.FileCacheManager", None}, stock
    assert scenario_triton.failed(stock) >= 3, stock
    assert all(e.split(": ", 2)[1].startswith(("FileNotFoundError", "FileExistsError")) for e in errors), errors

    for trial in range(3):
        fixed = scenario_triton.run(shared / f"sharedfs-{trial}", NODES, clean_env({"SHAREDFS_WAIT_TIMEOUT": "60"}))
        print(f"with sharedfs, trial {trial}:", scenario_triton.failed(fixed), "failed;",
              sum(r["hits"] for r in fixed), "hits,", sum(r["puts"] for r in fixed), "puts")
        assert scenario_triton.failed(fixed) == 0, scenario_triton.first_errors(fixed)
        assert {r["manager"] for r in fixed} == {SHAREDFS_MANAGER}, fixed
        # Every key directory holds the kernel's files, whole, and nothing else of the writers' (no temp
        # directory or file left, nothing removed, no lock file: a link needs no lock).
        keys = sorted((mount.backing / f"sharedfs-{trial}").iterdir())
        assert len(keys) == 6, keys
        for key in keys:
            names = {p.name for p in key.iterdir()}
            (kernel,) = {n.split(".")[0] for n in names if n.startswith("k")}
            assert names == {f"{kernel}.ttir", f"{kernel}.cubin", f"{kernel}.json", f"__grp__{kernel}.json"}, names
            assert all((key / n).stat().st_size > 0 for n in names), names


# One process of a node: Triton's cache manager for one key, driven step by step by the test.
SETUP = textwrap.dedent("""
    import hashlib, os
    from triton.runtime.cache import get_cache_manager
    manager = get_cache_manager(hashlib.sha256(b"one kernel").hexdigest())
    kind = type(manager).__module__ + "." + type(manager).__qualname__
""")


def _node(name: str, cache: Path, disabled: bool) -> NodeProcess:
    extra = {"SHAREDFS_DISABLE": "1"} if disabled else {}
    node = NodeProcess(name, env=clean_env({"TRITON_CACHE_DIR": str(cache), **extra}))
    node.run(SETUP)
    return node


@pytest.mark.parametrize("disabled", [True, False], ids=["stock", "sharedfs"])
def test_a_second_writer_never_replaces_the_file_a_reader_has_open(tmp_path: Path, disabled: bool) -> None:
    """Two nodes compile the same kernel: Triton's ``put`` renames the second copy over the first while
    the first node's reader has it open -- on NFS that reader's handle goes stale (``OSError: [Errno 116]
    Stale file handle``, ``cannot stat shared object: Stale file handle``; prime-rl PR #2305).  sharedfs
    keeps the entry that is there (the same kernel) and removes only its own temp file."""
    with _node("n0", tmp_path, disabled) as reader, _node("n1", tmp_path, disabled) as writer:
        path = reader.run("manager.put(b'\\x7fELF first copy', 'k.cubin')")
        reader.run(f"fh = open({path!r}, 'rb'); held = os.fstat(fh.fileno()).st_ino")
        before = sorted(os.listdir(os.path.dirname(path)))
        assert writer.run("manager.put(b'\\x7fELF second copy', 'k.cubin')") == path
        replaced = reader.run(f"os.stat({path!r}).st_ino != held")
        after = sorted(os.listdir(os.path.dirname(path)))
        kind = reader.run("kind")
    if disabled:
        assert kind == "triton.runtime.cache.FileCacheManager"
        assert replaced, "Triton's put replaced the entry the reader holds (a stale handle on NFS)"
    else:
        assert kind == SHAREDFS_MANAGER
        assert not replaced and Path(path).read_bytes() == b"\x7fELF first copy"
    assert after == before, (before, after)  # no temp directory or file left behind either way


@pytest.mark.parametrize("disabled", [True, False], ids=["stock", "sharedfs"])
def test_an_empty_entry_is_a_miss_and_the_kernel_is_published_again(tmp_path: Path, disabled: bool) -> None:
    """A group whose binary is empty (a writer killed between create and write, a filesystem that lost the
    data): Triton's ``get_group`` returns it and the kernel loads an empty binary; with sharedfs it is a
    miss, and the next ``put`` (the recompiled kernel) replaces the empty file under the entry's lock."""
    with _node("n0", tmp_path, disabled) as node:
        node.run("import json; cubin = manager.put(b'x', 'k.cubin'); meta = manager.put('{}', 'k.json');"
                 "manager.put_group('k.json', {'k.cubin': cubin, 'k.json': meta})")
        node.run("open(cubin, 'wb').close()")  # the binary is now empty
        group = node.run("manager.get_group('k.json')")
        file_hit = node.run("manager.get_file('k.cubin')")
        node.run("manager.put(b'\\x7fELF recompiled', 'k.cubin')")
        size = node.run("os.path.getsize(cubin)")
    if disabled:
        assert group is not None and file_hit is not None  # an empty kernel binary, handed out as a hit
        assert size > 0  # Triton's put renames over it
    else:
        assert group is None and file_hit is None  # a miss: Triton compiles again
        assert size == len(b"\x7fELF recompiled")


USERS_MANAGER = textwrap.dedent("""
    import hashlib, json, os, sys, logging
    import triton
    from triton.runtime.cache import get_cache_manager
    def kind():
        m = get_cache_manager(hashlib.sha256(b"k").hexdigest())
        return type(m).__module__ + "." + type(m).__qualname__
    seen = {"manager": kind()}
    before, os.environ["TRITON_CACHE_MANAGER"] = os.environ.get("TRITON_CACHE_MANAGER"), "mymanager:MyManager"
    seen["set later"] = kind()  # a manager named after the import is Triton's choice too, as without sharedfs
    if before is None:
        del os.environ["TRITON_CACHE_MANAGER"]
    import sharedfs
    sharedfs.disable()  # unpatch: Triton's own lookup again
    seen["after disable"] = kind()
    print(json.dumps(seen))
""")


@pytest.mark.parametrize(("extra", "expected"), [
    ({}, SHAREDFS_MANAGER),
    ({"SHAREDFS_DISABLE": "triton"}, "triton.runtime.cache.FileCacheManager"),
    ({"TRITON_CACHE_MANAGER": "mymanager:MyManager"}, "mymanager.MyManager"),
], ids=["installed", "SHAREDFS_DISABLE=triton", "users-own"])
def test_the_manager_is_installed_through_tritons_knob_unless_disabled_or_the_user_chose_one(
        tmp_path: Path, extra: dict[str, str], expected: str) -> None:
    (tmp_path / "mymanager.py").write_text(
        "from triton.runtime.cache import FileCacheManager\nclass MyManager(FileCacheManager):\n    pass\n")
    env = clean_env({"TRITON_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(tmp_path),
                     "SHAREDFS_LOG": "info", **extra})
    out = subprocess.run([sys.executable, "-c", USERS_MANAGER], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["manager"] == expected, (seen, out.stderr)
    assert seen["set later"] == "mymanager.MyManager", seen
    assert seen["after disable"] == ("mymanager.MyManager" if "TRITON_CACHE_MANAGER" in extra
                                     else "triton.runtime.cache.FileCacheManager"), seen
    said = [line for line in out.stderr.splitlines() if "triton cache manager left as the user set it" in line]
    assert len(said) == (1 if "TRITON_CACHE_MANAGER" in extra else 0), out.stderr


def test_status_lists_the_triton_shim_and_its_patch(tmp_path: Path) -> None:
    code = ("import json, triton; from sharedfs.commands.status import status_report; "
            "print(json.dumps([s for s in status_report()['shims'] if s['name'] == 'triton']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=clean_env({"TRITON_CACHE_DIR": str(tmp_path)}))
    assert out.returncode == 0, out.stderr[-3000:]
    (row,) = json.loads(out.stdout.strip().splitlines()[-1])
    assert row["installed"] == "3.9.0" and row["supported"] and row["applied"], row
    assert row["patches"] == ["cache_knobs.manager_class"], row


FIFO_GROUP = textwrap.dedent("""
    import hashlib, os, sys
    from triton.runtime.cache import get_cache_manager
    manager = get_cache_manager(hashlib.sha256(b"one kernel").hexdigest())
    os.mkfifo(os.path.join(manager.cache_dir, "__grp__k.json"))  # planted where the group file goes
    print(manager.get_group("k.json"), flush=True)
""")


@pytest.mark.parametrize("disabled", [True, False], ids=["stock", "sharedfs"])
def test_a_fifo_planted_as_a_group_file_is_a_miss_not_a_hang(tmp_path: Path, disabled: bool) -> None:
    """Anyone who can write a shared cache can plant a FIFO: Triton's ``get_group`` opens it and blocks forever;
    sharedfs reads group files without following symlinks or blocking, with a size cap."""
    env = clean_env({"TRITON_CACHE_DIR": str(tmp_path), **({"SHAREDFS_DISABLE": "1"} if disabled else {})})
    if disabled:
        with pytest.raises(subprocess.TimeoutExpired):
            subprocess.run([sys.executable, "-c", FIFO_GROUP], capture_output=True, text=True, env=env, timeout=10)
        return
    out = subprocess.run([sys.executable, "-c", FIFO_GROUP], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "None", out.stderr[-2000:]

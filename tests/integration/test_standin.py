"""The hub's lock class is a stand-in until the first lock: sharedfs loads then, never falls open.

``from huggingface_hub import hf_hub_download`` used to load sharedfs's whole kernel (pluggy,
the plugins, the policy: ~40 ms, a quarter of that import, benchmarks/startup.py).  The hub's
shim only replaces ``huggingface_hub.utils._fixes.FileLock``, so that class now gets a
stand-in at import and sharedfs activates on its first call.  These tests run the real hub in
fresh interpreters (the autoload is per process) and check what the stand-in must never do:
hand out the unpatched class after a refused activation, activate after ``sharedfs.disable()``,
or let two threads see different classes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import filelock
from helpers import clean_env


def run(code: str, tmp_path: Path, **env: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, cwd="/",
                          env=clean_env({"HF_HOME": str(tmp_path / "hf"), **env}), timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_refused_activation_fails_every_lock_not_just_the_first(tmp_path: Path) -> None:
    # A malformed setting must fail closed.  Were the original class left in place after the first
    # refusal, the second download would lock with the stock flock class: the failure sharedfs exists
    # to prevent, reached by retrying.
    code = """if 1:
        import json, os, sys
        import huggingface_hub.utils._fixes as f
        stock = f.FileLock.__mro__[1]
        out = []
        for _ in range(2):
            try:
                lock = f.FileLock(os.path.join(sys.argv[1], "a.lock"))
            except Exception as exc:
                out.append(type(exc).__name__)
            else:
                out.append(type(lock).__module__)
        print(json.dumps({"calls": out, "stock_in_place": f.FileLock is stock}))
    """
    assert run(code, tmp_path, SHAREDFS_LOCK="bogus") == {"calls": ["ConfigError", "ConfigError"],
                                                          "stock_in_place": False}
    # The same program with a valid setting gets sharedfs's class both times.
    assert run(code, tmp_path)["calls"] == ["sharedfs.shims.huggingface_hub"] * 2


def test_disable_before_the_first_lock_gives_the_hub_its_own_class(tmp_path: Path) -> None:
    code = """if 1:
        import json, os, sys, filelock
        import huggingface_hub.utils._fixes as f
        standin = f.FileLock
        import sharedfs
        sharedfs.disable()
        lock = f.FileLock(os.path.join(sys.argv[1], "a.lock"))
        late = standin(os.path.join(sys.argv[1], "b.lock"))  # a caller that kept the stand-in
        print(json.dumps({"restored": f.FileLock is filelock.FileLock, "lock": type(lock).__module__,
                          "late": type(late).__module__}))
    """
    # filelock's own class, wherever the installed release defines it (filelock._unix before 4.3,
    # filelock._native._unix since): the child runs this interpreter's filelock.
    unix = filelock.UnixFileLock.__module__
    assert unix.startswith("filelock.")
    assert run(code, tmp_path) == {"restored": True, "lock": unix, "late": unix}


def test_threads_racing_for_the_first_lock_all_get_sharedfs_and_one_activation(tmp_path: Path) -> None:
    code = """if 1:
        import json, os, sys, threading
        import huggingface_hub.utils._fixes as f
        import sharedfs.startup.activation as activation
        calls = []
        original = activation.activate
        def counting(*args, **kwargs):
            calls.append(args[0])
            return original(*args, **kwargs)
        activation.activate = counting
        barrier = threading.Barrier(8)
        kinds = []
        def worker(i):
            barrier.wait()
            kinds.append(type(f.FileLock(os.path.join(sys.argv[1], f"{i}.lock"))).__module__)
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for t in threads: t.start()
        for t in threads: t.join()
        hub = [c for c in calls if c == "huggingface_hub.utils._fixes"]
        print(json.dumps({"kinds": sorted(set(kinds)), "n": len(kinds), "activations": hub}))
    """
    assert run(code, tmp_path) == {"kinds": ["sharedfs.shims.huggingface_hub"], "n": 8,
                                   "activations": ["huggingface_hub.utils._fixes"]}


def test_a_subclass_of_the_stand_in_activates_sharedfs_and_builds_as_its_bases_say(tmp_path: Path) -> None:
    code = """if 1:
        import json, os, sys
        import huggingface_hub.utils._fixes as f
        class Mine(f.FileLock):
            pass
        lock = Mine(os.path.join(sys.argv[1], "a.lock"))
        with lock:
            held = lock.is_locked
        print(json.dumps({"type": type(lock).__name__, "held": held, "hub": f.FileLock.__module__,
                          "pluggy": "pluggy" in sys.modules}))
    """
    assert run(code, tmp_path) == {"type": "Mine", "held": True, "hub": "sharedfs.shims.huggingface_hub",
                                   "pluggy": True}


def test_a_first_lock_and_an_eager_activation_in_two_threads_do_not_deadlock(tmp_path: Path) -> None:
    # An eager activation (another framework imported in another thread) holds the kernel's lock and
    # then asks the stand-ins' table; a stand-in activating holds the first and waits for the second.
    # If the stand-in held its table while activating, each would wait for the other forever.
    code = """if 1:
        import json, os, sys, threading, time
        import huggingface_hub.utils._fixes as f
        import sharedfs.startup.activation as activation, sharedfs.machinery.standin as standin
        built = []
        with activation._lock:  # where an eager activation is when it asks the table
            first = threading.Thread(target=lambda: built.append(f.FileLock(os.path.join(sys.argv[1], "a.lock"))))
            first.start()
            time.sleep(0.5)  # the first lock is now activating, waiting for the kernel's lock
            asker = threading.Thread(target=standin.withdraw, args=("datasets",))
            asker.start()
            asker.join(5)
            answered = not asker.is_alive()
        first.join(30)
        asker.join(30)
        print(json.dumps({"table_answered_within_5s": answered, "lock": type(built[0]).__module__}))
    """
    assert run(code, tmp_path) == {"table_answered_within_5s": True, "lock": "sharedfs.shims.huggingface_hub"}

"""Reading the umask must not change it for the process's other threads (they create files meanwhile)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from sharedfs.fs.umask import current_umask


def _set_and_restore() -> int:
    """How the umask was read before (and how most code reads it): set it, then put it back."""
    umask = os.umask(0o666)
    os.umask(umask)
    return umask


def _modes_seen_while_reading(read: Callable[[], int], folder: Path, seconds: float = 3.0) -> set[int]:
    """Modes of the files another thread creates (asking for 0o644 under umask 022) while ``read`` runs in a loop."""
    modes: set[int] = set()
    stop = threading.Event()

    def create() -> None:
        n = 0
        while not stop.is_set():
            path = folder / f"f{n % 64}"
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            modes.add(os.fstat(fd).st_mode & 0o777)
            os.close(fd)
            os.unlink(path)
            n += 1

    old_umask, old_interval = os.umask(0o022), sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can: the window is two calls wide
    creator = threading.Thread(target=create)
    creator.start()
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and len(modes) < 2:
            for _ in range(200):
                assert read() == 0o022
    finally:
        stop.set()
        creator.join()
        sys.setswitchinterval(old_interval)
        os.umask(old_umask)
    return modes


def test_setting_and_restoring_the_umask_gives_another_threads_file_the_wrong_mode(tmp_path: Path) -> None:
    # The failure first: the old way, another thread's file is created under umask 0o666 (mode 0).
    assert _modes_seen_while_reading(_set_and_restore, tmp_path) >= {0o644, 0o000}


def test_reading_the_umask_from_proc_leaves_every_other_threads_file_its_mode(tmp_path: Path) -> None:
    assert Path("/proc/self/status").read_text().count("Umask:") == 1  # Linux >= 4.7: no fallback here
    assert _modes_seen_while_reading(current_umask, tmp_path) == {0o644}


def test_current_umask_is_the_processes_umask() -> None:
    for umask in ("0o000", "0o022", "0o077", "0o027"):
        code = f"import os; os.umask({umask}); from sharedfs.fs.umask import current_umask; print(oct(current_umask()))"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
        assert out == oct(int(umask, 8)), (umask, out)

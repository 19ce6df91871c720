"""The filesystem probe on real directories, with real faults.

Faults are injected with an ``LD_PRELOAD``
library that replaces libc's ``flock`` (Python's ``fcntl.flock`` calls it) in
the probe's worker processes, failing it with ENOSYS/ENOLCK, making it a no-op,
or making it hang like a call to a dead NFS lock daemon; and ``linkat``, made to
hang like any call on a dead server.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from harness.skips import skip_or_fail

import sharedfs.commands.probe
from sharedfs.commands.probe import CHECKS, SCHEMA_VERSION, probe

TOP_KEYS = {"schema", "path", "node", "workdir", "writable", "error", "seconds", "results", "cleanup"}
RESULT_KEYS = {"ok", "errno", "detail", "timed_out", "seconds"}

FAKE_FLOCK_C = r"""
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* FAKE_FLOCK=ENOSYS (Lustre without -o flock), ENOLCK (NFS without lockd),
   noop (a flock that never excludes) or hang (a lock call that never returns). */
int flock(int fd, int op) {
    const char *mode = getenv("FAKE_FLOCK");
    (void)fd; (void)op;
    if (mode && strcmp(mode, "hang") == 0) for (;;) pause();
    if (mode && strcmp(mode, "noop") == 0) return 0;
    errno = (mode && strcmp(mode, "ENOLCK") == 0) ? ENOLCK : ENOSYS;
    return -1;
}

/* FAKE_LINK=hang: link() never returns, like any call on a dead server.
   os.link calls link() (linkat() when given dir_fd); otherwise pass through. */
static void maybe_hang_link(void) {
    const char *mode = getenv("FAKE_LINK");
    if (mode && strcmp(mode, "hang") == 0) for (;;) pause();
}

int link(const char *oldpath, const char *newpath) {
    maybe_hang_link();
    return (int)syscall(SYS_linkat, AT_FDCWD, oldpath, AT_FDCWD, newpath, 0);
}

int linkat(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, int flags) {
    maybe_hang_link();
    return (int)syscall(SYS_linkat, olddirfd, oldpath, newdirfd, newpath, flags);
}
"""


def _assert_schema(report: dict) -> None:
    assert set(report) == TOP_KEYS
    assert report["schema"] == SCHEMA_VERSION
    assert list(report["results"]) == list(CHECKS)
    for result in [*report["results"].values(), report["cleanup"]]:
        assert set(result) == RESULT_KEYS
    json.dumps(report)


def _leftover_processes(marker: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


# -- a healthy local directory -----------------------------------------------------------------


def test_probe_on_a_local_directory_passes_every_check(tmp_path: Path) -> None:
    report = probe(tmp_path)
    _assert_schema(report)
    assert report["writable"] is True and report["error"] is None
    failed = {name: r["detail"] for name, r in report["results"].items() if not r["ok"]}
    assert failed == {}
    assert "refused" in report["results"]["flock_excludes"]["detail"]
    assert "refused" in report["results"]["posix_excludes"]["detail"]
    assert report["cleanup"]["ok"]
    assert not os.path.exists(report["workdir"])
    assert list(tmp_path.iterdir()) == []


# -- paths the probe cannot use ----------------------------------------------------------------


def test_probe_reports_a_missing_directory(tmp_path: Path) -> None:
    report = probe(tmp_path / "missing")
    _assert_schema(report)
    assert report["writable"] is False
    assert "does not exist" in report["error"]
    assert all(not r["ok"] and r["detail"].startswith("not run") for r in report["results"].values())
    assert report["cleanup"]["ok"]


def test_probe_reports_a_read_only_filesystem(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        skip_or_fail("mounting needs root")
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(tmp_path)], check=True, capture_output=True
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        skip_or_fail(f"cannot mount here: {exc}")
    try:
        report = probe(tmp_path)
    finally:
        subprocess.run(["umount", "-l", str(tmp_path)], check=False)
    _assert_schema(report)
    assert report["writable"] is False
    assert "not writable" in report["error"] and "EROFS" in report["error"]
    assert not any(r["ok"] for r in report["results"].values())


def test_probe_reports_a_directory_without_write_permission(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if os.geteuid() != 0:
        report = probe(locked)
    else:
        # Root ignores permission bits through CAP_DAC_OVERRIDE: run the probe
        # in a process whose capability bounding set lacks it (a uid switch
        # would also lose access to this interpreter under /root).
        if shutil.which("setpriv") is None:
            skip_or_fail("setpriv is needed to drop root's permission override")
        src = str(Path(sharedfs.commands.probe.__file__).resolve().parents[2])
        code = "import json, sys; from sharedfs.commands.probe import probe; print(json.dumps(probe(sys.argv[1])))"
        run = subprocess.run(
            ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--", sys.executable, "-c", code, str(locked)],
            check=False,
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": src},
        )
        if run.returncode != 0:
            skip_or_fail(f"setpriv could not drop capabilities: {run.stderr.strip()}")
        report = json.loads(run.stdout)
    _assert_schema(report)
    assert report["writable"] is False
    assert "not writable by uid" in report["error"] and "EACCES" in report["error"]
    assert list(locked.iterdir()) == []


# -- injected lock faults ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def fake_flock(tmp_path_factory: pytest.TempPathFactory) -> str:
    if shutil.which("gcc") is None:
        skip_or_fail("gcc is needed to build the LD_PRELOAD library")
    build = tmp_path_factory.mktemp("fakeflock")
    (build / "fakeflock.c").write_text(FAKE_FLOCK_C)
    library = build / "libfakeflock.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", str(library), str(build / "fakeflock.c")], check=True)
    return str(library)


@pytest.mark.parametrize("err", ["ENOSYS", "ENOLCK"])
def test_probe_reports_the_errno_of_a_failing_flock(
    tmp_path: Path, fake_flock: str, monkeypatch: pytest.MonkeyPatch, err: str
) -> None:
    monkeypatch.setenv("LD_PRELOAD", fake_flock)
    monkeypatch.setenv("FAKE_FLOCK", err)
    report = probe(tmp_path)
    _assert_schema(report)
    results = report["results"]
    assert (results["flock"]["ok"], results["flock"]["errno"]) == (False, err)
    assert (results["flock_excludes"]["ok"], results["flock_excludes"]["errno"]) == (False, err)
    assert results["posix"]["ok"] and results["posix_excludes"]["ok"]  # fcntl() is untouched
    assert report["cleanup"]["ok"]


def test_probe_detects_a_flock_that_does_not_exclude(
    tmp_path: Path, fake_flock: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LD_PRELOAD", fake_flock)
    monkeypatch.setenv("FAKE_FLOCK", "noop")
    report = probe(tmp_path)
    assert report["results"]["flock"]["ok"]  # taking it "works" ...
    excludes = report["results"]["flock_excludes"]
    assert not excludes["ok"] and "does not exclude" in excludes["detail"]  # ... but means nothing


def test_probe_reports_a_hung_lock_call_and_still_runs_the_other_checks(
    tmp_path: Path, fake_flock: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LD_PRELOAD", fake_flock)
    monkeypatch.setenv("FAKE_FLOCK", "hang")
    report = probe(tmp_path, timeout=1.0)
    _assert_schema(report)
    results = report["results"]
    assert results["flock"]["timed_out"] and not results["flock"]["ok"]
    assert results["flock_excludes"]["detail"] == "not run: the flock call hung"
    assert all(results[name]["ok"] for name in CHECKS if not name.startswith("flock"))
    assert report["cleanup"]["ok"] and not os.path.exists(report["workdir"])
    assert report["seconds"] < 5.0
    assert _leftover_processes(report["workdir"]) == []


def test_probe_stops_when_the_filesystem_itself_hangs(
    tmp_path: Path, fake_flock: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LD_PRELOAD", fake_flock)
    monkeypatch.setenv("FAKE_FLOCK", "noop")
    monkeypatch.setenv("FAKE_LINK", "hang")
    report = probe(tmp_path, timeout=1.0)
    _assert_schema(report)
    results = report["results"]
    assert results["link"]["timed_out"]
    for name in ("rename_replace", "fsync"):
        assert results[name]["detail"] == "not run: the link check hung"
    assert results["o_excl"]["ok"]
    assert report["cleanup"]["ok"] and not os.path.exists(report["workdir"])
    assert _leftover_processes(report["workdir"]) == []

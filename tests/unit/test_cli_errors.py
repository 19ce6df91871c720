"""Every command, under every kind of bad setting and with its stdout closed early, ends in one line.

A mature command line never answers a typo with a traceback: each subcommand turns a bad
``SHAREDFS_*`` value, a bad ``SHAREDFS_CONFIG`` file and an unknown ``SHAREDFS_DISABLE`` name into
one line on stderr naming the setting and the fix, with exit status 2 (docs/cli.md, "Exit status"),
and ``env`` then prints nothing a shell could evaluate.  A reader that stops early (``| head -1``)
ends the command quietly with 141, as a program killed by SIGPIPE, never with ``BrokenPipeError``.

Before this, ``doctor`` and ``env`` ended in a ``ConfigError`` traceback (rc 1), ``locks`` and
``cleanup`` ignored the setting, ``SHAREDFS_DISABLE=dataset`` passed silently, and ``doctor /tmp |
head -1`` printed ``BrokenPipeError`` tracebacks.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import clean_env

#: One command line per subcommand (two where --json prints differently); PATH is a fresh directory.
COMMANDS = {
    "status": ["status"],
    "status --json": ["status", "--json"],
    "doctor": ["doctor", "PATH"],
    "doctor --json": ["doctor", "--json", "PATH"],
    "locks": ["locks", "PATH"],
    "env": ["env"],
    "env --json": ["env", "--json"],
    "cleanup": ["cleanup", "--job", "4242", "--uid", str(os.getuid())],
    "demo": ["demo", "--only", "no scenario is called this", "--no-fuse"],
}

#: Each kind of bad setting, and the name the one line must say.
BAD_SETTINGS = {
    "bad SHAREDFS_LOCK": ({"SHAREDFS_LOCK": "bogus"}, "SHAREDFS_LOCK"),
    "SHAREDFS_CONFIG not TOML": ({"SHAREDFS_CONFIG": "CONFIG"}, "SHAREDFS_CONFIG"),
    "SHAREDFS_CONFIG unknown key": ({"SHAREDFS_CONFIG": "UNKNOWN"}, "lok"),
    "SHAREDFS_CONFIG missing": ({"SHAREDFS_CONFIG": "/nonexistent/sharedfs.toml"}, "SHAREDFS_CONFIG"),
    "unknown SHAREDFS_DISABLE name": ({"SHAREDFS_DISABLE": "dataset"}, "SHAREDFS_DISABLE"),
}


#: A demo that runs one quick scenario (a few seconds), so that it has results to print.
QUICK_DEMO = ["demo", "--only", "a live lock is never broken", "--no-fuse"]


def _argv(name: str, path: Path, runs: bool = False) -> list[str]:
    words = QUICK_DEMO if name == "demo" and runs else COMMANDS[name]
    return [str(path) if word == "PATH" else word for word in words]


def _env(setting: str, tmp_path: Path) -> dict[str, str]:
    values, _ = BAD_SETTINGS[setting]
    (tmp_path / "bad.toml").write_text("lock = [\n")
    (tmp_path / "unknown.toml").write_text('lok = "soft"\n')
    files = {"CONFIG": str(tmp_path / "bad.toml"), "UNKNOWN": str(tmp_path / "unknown.toml")}
    return clean_env({key: files.get(value, value) for key, value in values.items()})


def sharedfs(*args: str, env: dict[str, str] | None = None, cwd: str | None = None,
             stdout: int | None = subprocess.PIPE) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sharedfs", *args], stdout=stdout, stderr=subprocess.PIPE,
                          text=True, env=env if env is not None else clean_env(), cwd=cwd, timeout=300, check=False)


def assert_one_line(proc: subprocess.CompletedProcess[str], command: str, *names: str) -> str:
    err = proc.stderr
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{err}"
    assert lines[0].startswith(f"sharedfs {command}: "), lines[0]
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


@pytest.mark.parametrize("setting", sorted(BAD_SETTINGS))
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_under_every_bad_setting_says_one_line(name: str, setting: str, tmp_path: Path) -> None:
    env = _env(setting, tmp_path)
    proc = sharedfs(*_argv(name, tmp_path), env=env)
    line = assert_one_line(proc, name.split()[0], BAD_SETTINGS[setting][1])
    assert "fix" in line  # and what to do about it
    assert proc.returncode == 2, (proc.returncode, line)
    if name.startswith("env"):  # nothing a shell could evaluate
        assert proc.stdout == ""
    if name == "status":  # the report still shows, with the error in it
        assert "CONFIG ERROR" in proc.stdout


def _closed_pipe() -> int:
    """A pipe whose reading end is already closed: the first write fails with EPIPE."""
    read, write = os.pipe()
    os.close(read)
    return write


@pytest.mark.parametrize("setting", ["none", *sorted(BAD_SETTINGS)])
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_closed_stdout_ends_quietly(name: str, setting: str, tmp_path: Path) -> None:
    env = clean_env() if setting == "none" else _env(setting, tmp_path)
    write = _closed_pipe()
    try:
        proc = sharedfs(*_argv(name, tmp_path, runs=setting == "none"), env=env, stdout=write)
    finally:
        os.close(write)
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr
    assert "Exception ignored" not in proc.stderr, proc.stderr
    if setting == "none":
        # Every one of these prints something, so each met the closed pipe: 141, as a shell reports a
        # program that SIGPIPE ended; nothing is said about it (the demo's progress goes to stderr).
        assert proc.returncode == 141, (proc.returncode, proc.stderr)
        assert proc.stderr == "" or name == "demo", proc.stderr
    else:
        assert proc.returncode in (2, 141), proc.returncode
        if proc.returncode == 2:
            assert_one_line(proc, name.split()[0])


@pytest.mark.parametrize("args", [["--help"], ["doctor", "--help"], ["--version"]])
def test_help_into_a_closed_pipe_ends_quietly(args: list[str]) -> None:
    write = _closed_pipe()
    try:
        proc = sharedfs(*args, stdout=write)
    finally:
        os.close(write)
    assert proc.stderr == "" and proc.returncode == 141, (proc.returncode, proc.stderr)


def test_the_console_script_and_a_real_head_end_quietly(tmp_path: Path) -> None:
    """`sharedfs doctor DIR | head -1` in a real shell, through the installed console script."""
    script = Path(sys.executable).with_name("sharedfs")
    proc = subprocess.run(["bash", "-c", f'set -o pipefail; "{script}" doctor "{tmp_path}" "{tmp_path}" | head -1; '
                           f'"{script}" status --json | head -1'],
                          capture_output=True, text=True, env=clean_env(), timeout=300, check=False)
    assert proc.stderr == "", proc.stderr
    assert proc.stdout.splitlines() == [str(tmp_path), "{"]


def test_a_set_e_batch_script_stops_at_a_bad_setting_with_one_line() -> None:
    """The documented recipe: `exports="$(sharedfs env)"` stops a `set -e` script; eval never runs a partial list.

    (`eval "$(sharedfs env)"` alone cannot stop one: a shell's eval of an empty string succeeds.)
    """
    script = Path(sys.executable).with_name("sharedfs")
    recipe = f'set -e; exports="$("{script}" env)"; eval "$exports"; echo "reached: ${{WIDS_CACHE:-unset}}"'
    bad = subprocess.run(["bash", "-c", recipe], capture_output=True, text=True,
                         env=clean_env({"SHAREDFS_LOCK": "bogus"}), timeout=300, check=False)
    assert bad.returncode == 2 and "reached" not in bad.stdout
    assert_one_line(bad, "env", "SHAREDFS_LOCK")
    good = subprocess.run(["bash", "-c", recipe], capture_output=True, text=True, env=clean_env(), timeout=300,
                          check=False)
    assert good.returncode == 0 and good.stdout.startswith("reached: /"), (good.stdout, good.stderr)


def test_ctrl_c_ends_a_command_in_one_line(tmp_path: Path) -> None:
    """Ctrl-C while `doctor --cross-node` waits for the other nodes: one line and 130, not a KeyboardInterrupt traceback."""
    import signal
    import time

    env = clean_env({"SLURM_JOB_ID": "42", "SLURM_STEP_NUM_NODES": "2", "SHAREDFS_NODE_ID": "a"})
    # As at a terminal: Ctrl-C's default action.  A runner started in the background (`make test &`,
    # nohup) hands its children SIGINT ignored, and Python then installs no KeyboardInterrupt handler.
    proc = subprocess.Popen([sys.executable, "-m", "sharedfs", "doctor", "--cross-node", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while not any(tmp_path.glob(".sharedfs-crossnode-42.*/*")):  # it has met the rendezvous: now it waits
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert err == "sharedfs doctor: interrupted\n" and proc.returncode == 130, (proc.returncode, err)


def test_a_fifo_planted_in_the_cross_node_meeting_place_does_not_hang_doctor(tmp_path: Path) -> None:
    """A FIFO named like another node's post (`hello@b`) made `doctor --cross-node` block for ever in its read (no
    writer ever comes). Now it is read as untrusted (no blocking open), and the probe ends at its --timeout with one
    line. (The meeting place is private to the job's user now: the FIFO is put there once doctor made it.)"""
    meeting = tmp_path / ".sharedfs-crossnode-42.0"
    env = clean_env({"SLURM_JOB_ID": "42", "SLURM_STEP_NUM_NODES": "2", "SHAREDFS_NODE_ID": "a"})
    cmd = [sys.executable, "-m", "sharedfs", "doctor", "--cross-node", "--timeout", "2", str(tmp_path)]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as running:
        while not (meeting / "hello@a").exists() and running.poll() is None:  # it waits for b now
            time.sleep(0.005)
        os.mkfifo(meeting / "hello@b")
        try:
            out, err = running.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            running.kill()
            pytest.fail("doctor --cross-node still blocked on the planted FIFO after 60 s (its --timeout is 2 s)")
    proc = subprocess.CompletedProcess(cmd, running.returncode, out, err)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("sharedfs doctor --cross-node: waited 2 s in ") and proc.stderr.count("\n") == 1

"""A hostile or mistaken SHAREDFS_CONFIG / SHAREDFS_* value fails fast with a ConfigError naming the variable.

Settings are read when a framework is imported, so a config file that blocks (a
FIFO, ``/dev/zero``) hangs ``import datasets``, and one that raises anything but
ConfigError is reported as sharedfs's own internal error.  The slow cases run in
a child process with a deadline, so the old behaviour fails the test instead of
hanging the run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import clean_env

import sharedfs
from sharedfs import ConfigError

#: A child that needs longer than this to report a bad config file is hanging.
DEADLINE = 20.0
#: Children import the sharedfs under test (this checkout), whatever the venv has installed.
CHECKOUT = str(Path(sharedfs.__file__).resolve().parents[1])


def child_env(**extra: str) -> dict[str, str]:
    return clean_env({"PYTHONPATH": CHECKOUT, **extra})

POLICY_IN_CHILD = """
import sharedfs, sys
from sharedfs.machinery import runtime
try:
    runtime.policy()
except sharedfs.ConfigError as exc:
    print("ConfigError:", exc)
    sys.exit(3)
print("no error")
"""


def policy_in_child(config: str) -> tuple[subprocess.CompletedProcess[str] | None, float]:
    """Resolve the policy in a fresh interpreter with SHAREDFS_CONFIG=config; (None, elapsed) if it hung."""
    started = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-c", POLICY_IN_CHILD], check=False, capture_output=True, text=True,
                              env=child_env(SHAREDFS_CONFIG=config), timeout=DEADLINE)
    except subprocess.TimeoutExpired:
        return None, time.monotonic() - started
    return proc, time.monotonic() - started


def test_a_fifo_as_config_fails_fast(tmp_path: Path) -> None:
    fifo = tmp_path / "policy.toml"
    os.mkfifo(fifo)
    proc, elapsed = policy_in_child(str(fifo))
    assert proc is not None, f"reading SHAREDFS_CONFIG={fifo} (a FIFO without a writer) hung for {elapsed:.0f} s"
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert f"SHAREDFS_CONFIG='{fifo}' is not valid: expected a regular TOML file (it is a FIFO)" in proc.stdout
    assert elapsed < DEADLINE / 2


def test_dev_zero_as_config_fails_fast() -> None:
    proc, elapsed = policy_in_child("/dev/zero")
    assert proc is not None, f"reading SHAREDFS_CONFIG=/dev/zero never ended ({elapsed:.0f} s)"
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "SHAREDFS_CONFIG='/dev/zero' is not valid: expected a regular TOML file (it is a character device)" \
        in proc.stdout


def read_layer(path: Path) -> ConfigError:
    from sharedfs.plugins.settings import read_toml_layer

    with pytest.raises(ConfigError) as info:
        read_toml_layer(str(path))
    assert info.value.origin == "SHAREDFS_CONFIG" or info.value.origin.startswith(str(path))
    return info.value


def test_a_binary_config_file_is_a_config_error(tmp_path: Path) -> None:
    binary = tmp_path / "policy.toml"
    binary.write_bytes(b"lock = \"soft\"\n\xff\xfe\x00\x81 garbage")
    error = read_layer(binary)
    assert str(error) == (f"SHAREDFS_CONFIG='{binary}' is not valid: expected a UTF-8 TOML file "
                          "(byte 14 is not UTF-8)")


def test_an_oversized_config_file_is_refused_before_it_is_read(tmp_path: Path) -> None:
    big = tmp_path / "policy.toml"
    big.write_text("# padding\n" * 200_000 + 'lock = "soft"\n')
    assert "expected a TOML file of at most 1048576 bytes (it has 2000014)" in str(read_layer(big))


def test_a_directory_as_config_is_refused(tmp_path: Path) -> None:
    assert "expected a regular TOML file (it is a directory)" in str(read_layer(tmp_path))


def test_deeply_nested_toml_is_a_config_error(tmp_path: Path) -> None:
    deep = tmp_path / "policy.toml"
    deep.write_text("x = " + "[" * 50_000 + "]" * 50_000 + "\n")
    error = read_layer(deep)
    assert "expected valid TOML" in str(error)


def test_a_symlinked_config_file_is_followed(tmp_path: Path) -> None:
    """The user named the file: a link to the site's policy is a legitimate way to name it."""
    from sharedfs.plugins.settings import read_toml_layer

    real = tmp_path / "real.toml"
    real.write_text('lock = "soft"\n')
    (tmp_path / "link.toml").symlink_to(real)
    assert read_toml_layer(str(tmp_path / "link.toml")).values == {"lock": "soft"}


def test_a_huge_environment_value_is_refused_without_quoting_it_whole() -> None:
    from sharedfs.plugins.settings import sharedfs_settings_layers

    with pytest.raises(ConfigError) as info:
        sharedfs_settings_layers({"SHAREDFS_LOCK": "x" * 100_000})
    message = str(info.value)
    assert message.startswith("SHAREDFS_LOCK='xxxx") and "at most 4096 characters" in message
    assert len(message) < 400


def test_a_huge_string_in_the_config_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(f'cache_root = "/{"a" * 10_000}"\n')
    assert f"{path}: cache_root='/aaa" in str(read_layer(path))


@pytest.mark.parametrize(("variable", "value", "expected"), [
    ("SHAREDFS_LEASE_SECONDS", "1e300", "a number of seconds from 1 to 86400"),
    ("SHAREDFS_WAIT_TIMEOUT", "1e300", "a positive number of seconds, at most 2592000"),
    ("SHAREDFS_NODE_ID", "n" * 300, "a name of 1 to 64 characters"),
    ("SHAREDFS_MAX_WORKERS", "100000", "auto, off or a whole number from 1 to 4096"),
])
def test_out_of_range_values_fail_at_policy_time(fresh_runtime, monkeypatch: pytest.MonkeyPatch, variable: str,
                                                 value: str, expected: str) -> None:
    """Not later and elsewhere (a lease's ValueError, ENAMETOOLONG on a record file)."""
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=f"^{variable}=.*expected {expected}"):
        fresh_runtime.policy()

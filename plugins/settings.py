"""Settings from the TOML file (``SHAREDFS_CONFIG``) and the ``SHAREDFS_*`` environment.

Read at a framework's first import, so neither may hang it or fail with anything but a named ``ConfigError``.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Mapping
from typing import Any

from sharedfs.errors import ConfigError
from sharedfs.types import BY_NAME, MAX_VALUE_CHARS, Layer, envvars, from_environ, hookimpl

FILE_PRIORITY = 100
ENV_PRIORITY = 200
#: A policy file is a few hundred bytes; a site file with other tables, a few KiB.
MAX_FILE_BYTES = 1024 * 1024


@hookimpl
def sharedfs_settings_layers(environ: Mapping[str, str]) -> list[Layer]:
    layers = []
    path = environ.get(envvars.CONFIG, "").strip()
    if path:
        layers.append(read_toml_layer(path))
    values, origins = from_environ(environ)
    layers.append(Layer("environment", ENV_PRIORITY, values, origins))
    return layers


def read_toml_layer(path: str) -> Layer:
    """The TOML policy file as a layer.  Keys are the settings' names; unknown keys are errors."""
    data = _read_toml(path)
    # Accept a bare file or a [sharedfs] table, so the same keys can live in a bigger site file.
    table = data.get("sharedfs", data)
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: sharedfs", table, "a table of settings")
    for key, value in table.items():
        if key not in BY_NAME:
            raise ConfigError(f"{path}: {key}", value, "a known key: " + ", ".join(BY_NAME))
        if isinstance(value, str) and len(value) > MAX_VALUE_CHARS:
            raise ConfigError(f"{path}: {key}", value[:40] + "...", f"at most {MAX_VALUE_CHARS} characters",
                              f"it has {len(value)}")
    return Layer(f"file {path}", FILE_PRIORITY, dict(table), {key: f"{path}: {key}" for key in table})


def _read_toml(path: str) -> dict[str, Any]:
    # Imported here: most processes name no config file, and the TOML parser is not free to import.
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on 3.9/3.10
        import tomli as tomllib
    data = _read_config_bytes(path)
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(envvars.CONFIG, path, "a UTF-8 TOML file", f"byte {exc.start} is not UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(envvars.CONFIG, path, "valid TOML", str(exc)) from None
    except RecursionError:  # arrays nested thousands deep
        raise ConfigError(envvars.CONFIG, path, "valid TOML", "nested too deeply") from None


def _read_config_bytes(path: str) -> bytes:
    """The file's bytes, if it is a regular file of at most MAX_FILE_BYTES; never blocks on open or read."""
    try:
        # O_NONBLOCK: opening a FIFO returns at once instead of waiting for a writer (and the type
        # check below refuses it); no O_NOFOLLOW: a symlink the user named is the user's choice.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise ConfigError(envvars.CONFIG, path, "a readable TOML file", exc.strerror or str(exc)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(envvars.CONFIG, path, "a regular TOML file", f"it is {_kind(st.st_mode)}")
        if st.st_size > MAX_FILE_BYTES:
            raise ConfigError(envvars.CONFIG, path, f"a TOML file of at most {MAX_FILE_BYTES} bytes",
                              f"it has {st.st_size}")
        chunks = []
        size = 0
        while size <= MAX_FILE_BYTES:  # the file may grow while we read: never more than the cap
            chunk = os.read(fd, MAX_FILE_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise ConfigError(envvars.CONFIG, path, "a readable TOML file", exc.strerror or str(exc)) from None
    finally:
        os.close(fd)
    if size > MAX_FILE_BYTES:
        raise ConfigError(envvars.CONFIG, path, f"a TOML file of at most {MAX_FILE_BYTES} bytes", "it grew past that")
    return b"".join(chunks)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return f"not a regular file (mode {mode:o})"

"""Settings from the TOML file (``SHAREDFS_CONFIG``) and the ``SHAREDFS_*`` environment."""

from __future__ import annotations

import sys
from typing import Any, Mapping

from sharedfs import envvars
from sharedfs.errors import ConfigError
from sharedfs.hookspecs import hookimpl
from sharedfs._policy import Layer
from sharedfs.settings import BY_NAME, SETTINGS

FILE_PRIORITY = 100
ENV_PRIORITY = 200


@hookimpl
def sharedfs_settings_layers(environ: Mapping[str, str]) -> list[Layer]:
    layers = []
    path = environ.get(envvars.CONFIG, "").strip()
    if path:
        layers.append(read_toml_layer(path))
    values = {}
    origins = {}
    for setting in SETTINGS:
        raw = environ.get(setting.env, "")
        if raw.strip():  # an exported-but-empty variable means "not set", as in most tools
            values[setting.name] = raw
            origins[setting.name] = setting.env
    layers.append(Layer("environment", ENV_PRIORITY, values, origins))
    return layers


def read_toml_layer(path: str) -> Layer:
    """The TOML policy file as a layer.  Keys are the settings' names; unknown keys are errors."""
    data = _read_toml(path)
    # Accept a bare file or a [sharedfs] table, so the same keys can live in a bigger site file.
    table = data.get("sharedfs", data)
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: sharedfs", table, "a table of settings")
    for key in table:
        if key not in BY_NAME:
            raise ConfigError(f"{path}: {key}", table[key], "a known key: " + ", ".join(BY_NAME))
    return Layer(f"file {path}", FILE_PRIORITY, dict(table), {key: f"{path}: {key}" for key in table})


def _read_toml(path: str) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on 3.9/3.10
        import tomli as tomllib
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(envvars.CONFIG, path, "a readable TOML file", exc.strerror or str(exc)) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(envvars.CONFIG, path, "valid TOML", str(exc)) from None

"""The helper names datasets' tests import from ``tests/utils.py``, which the sdist does not ship.

Written for sharedfs's tests/upstream/run.py from how the tests use each name: ``require_X``
skips when X is not importable, ``slow`` skips unless RUN_SLOW=1, the Arrow-memory checks compare
``pyarrow.total_allocated_bytes()``.  Hub-dependent helpers (``offline``,
``push_parquet_shards_offline``) only serve tests marked ``integration``, which run.py deselects.
"""

from __future__ import annotations

import gc
import os
import sys
import tempfile
from contextlib import contextmanager
from enum import Enum
from importlib.util import find_spec
from unittest.mock import patch

import pyarrow as pa
import pytest


def _flag(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    return default if value is None else value.strip().lower() in ("1", "true", "yes", "on")


def _require(*modules: str):
    missing = [m for m in modules if find_spec(m) is None]
    return pytest.mark.skipif(bool(missing), reason=f"test requires {', '.join(missing)}")


def _version_at_least(module: str, minimum: str) -> bool:
    if find_spec(module) is None:
        return False
    from importlib.metadata import version

    from packaging.version import Version

    try:
        return Version(version(module)) >= Version(minimum)
    except Exception:  # noqa: BLE001 - unknown version: treat as too old
        return False


require_zstandard = _require("zstandard")
require_lz4 = _require("lz4")
require_py7zr = _require("py7zr")
require_pil = _require("PIL")
require_torch = _require("torch")
require_torchcodec = _require("torchcodec")
require_polars = _require("polars")
require_pyspark = _require("pyspark")
require_regex = _require("regex")
require_spacy = _require("spacy")
require_sqlalchemy = _require("sqlalchemy")
require_tf = _require("tensorflow")
require_jax = _require("jax")
require_tiktoken = _require("tiktoken")
require_transformers = _require("transformers")
require_torch_compile = pytest.mark.skipif(
    find_spec("torch") is None or sys.version_info >= (3, 14), reason="test requires torch.compile"
)
require_dill_gt_0_3_2 = pytest.mark.skipif(not _version_at_least("dill", "0.3.3"), reason="test requires dill>0.3.2")
require_not_windows = pytest.mark.skipif(sys.platform == "win32", reason="test should not be run on Windows")
require_numpy1_on_windows = pytest.mark.skipif(
    sys.platform == "win32" and _version_at_least("numpy", "2"), reason="test requires numpy 1 on Windows"
)
slow = pytest.mark.skipif(not _flag("RUN_SLOW"), reason="slow test (set RUN_SLOW=1)")


@contextmanager
def set_current_working_directory_to_temp_dir(*args, **kwargs):
    before = os.getcwd()
    with tempfile.TemporaryDirectory(*args, **kwargs) as where:
        os.chdir(where)
        try:
            yield
        finally:
            os.chdir(before)


def _arrow_bytes() -> int:
    gc.collect()
    return pa.total_allocated_bytes()


@contextmanager
def assert_arrow_memory_increases():
    before = _arrow_bytes()
    yield
    assert pa.total_allocated_bytes() > before, "Arrow memory didn't increase."


@contextmanager
def assert_arrow_memory_doesnt_increase():
    before = _arrow_bytes()
    yield
    assert pa.total_allocated_bytes() <= before, "Arrow memory wasn't expected to increase."


class OfflineSimulationMode(Enum):
    CONNECTION_FAILS = 0
    CONNECTION_TIMES_OUT = 1
    HF_HUB_OFFLINE_SET_TO_1 = 2


@contextmanager
def offline(mode: OfflineSimulationMode = OfflineSimulationMode.CONNECTION_FAILS):
    """Approximation for the integration tests (deselected by run.py): every mode = hub offline."""
    with patch("datasets.config.HF_HUB_OFFLINE", True):
        yield


def push_parquet_shards_offline(*args, **kwargs):
    pytest.skip("push_parquet_shards_offline needs upstream's hub test glue (not in the sdist)")

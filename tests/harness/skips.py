"""The one rule for test infrastructure that is missing: skip locally, fail under CI."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

__all__ = ["skip_or_fail"]


def skip_or_fail(reason: str, *, module_level: bool = False) -> NoReturn:
    """Skip the test (or with ``module_level``, the whole test file) for ``reason``; fail instead
    when running in CI, where the setup installs everything and a skip would hide a broken setup."""
    if os.environ.get("CI"):
        pytest.fail(f"required test infrastructure missing in CI: {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=module_level)

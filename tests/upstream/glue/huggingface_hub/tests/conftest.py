"""pytest glue for huggingface_hub's own tests, written for sharedfs's tests/upstream/run.py.

The sdist ships the test modules but not ``tests/conftest.py``.  This provides what the selected
modules need, from how the tests use each name:

* every test gets a fresh hub cache, home, token path and xet cache in a temp dir (the hub's own
  constants are patched, so nothing touches ~/.cache/huggingface);
* ``@pytest.mark.xet`` / ``no_xet`` skip when hf_xet is absent / present, as the markers say;
* ``RepoFactory`` (a type the tests import) and the ``api`` / ``api_prod`` / ``repo_factory``
  fixtures, which need the Hub's staging or production endpoint: they skip, so a network test
  that is missing from deselect.txt is reported as skipped, never as a sharedfs difference;
* a test that asks for a fixture nobody provides is skipped, naming the fixture.
"""

from __future__ import annotations

import os
from typing import Protocol

import pytest

from huggingface_hub import constants
from huggingface_hub.utils import SoftTemporaryDirectory
from huggingface_hub.utils._runtime import is_package_available


def pytest_collection_modifyitems(config, items):
    for item in items:
        known = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", None)
        if known is None:
            continue
        missing = sorted(n for n in item.fixturenames if n not in known and n != "request")
        if missing:
            item.add_marker(pytest.mark.skip(reason=f"upstream fixture not in the sdist: {', '.join(missing)}"))


_CACHE_CONSTANTS = {
    "HF_HOME": "",
    "HF_HUB_CACHE": "hub",
    "HUGGINGFACE_HUB_CACHE": "hub",
    "HF_XET_CACHE": "xet",
    "HF_ASSETS_CACHE": "assets",
    "HF_TOKEN_PATH": "token",
    "HF_STORED_TOKENS_PATH": "stored_tokens",
}


@pytest.fixture(autouse=True)
def _private_hub_home(monkeypatch):
    with SoftTemporaryDirectory() as home:
        for name, sub in _CACHE_CONSTANTS.items():
            if hasattr(constants, name):
                monkeypatch.setattr(constants, name, os.path.join(home, sub) if sub else home)
        monkeypatch.setattr(constants, "HF_HUB_DISABLE_EXPERIMENTAL_WARNING", True, raising=False)
        yield


@pytest.fixture(autouse=True)
def _xet_markers(request, monkeypatch):
    xet = request.node.get_closest_marker("xet") is not None
    no_xet = request.node.get_closest_marker("no_xet") is not None
    if xet:
        if not is_package_available("hf_xet"):
            pytest.skip("test requires hf_xet (marked xet)")
        monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", False)
        monkeypatch.delenv("HF_HUB_DISABLE_XET", raising=False)
    elif no_xet and is_package_available("hf_xet"):
        pytest.skip("test must run without hf_xet (marked no_xet)")


class RepoFactory(Protocol):
    """Creates a repo on the Hub's staging endpoint (type imported by test_file_download)."""

    def __call__(self, repo_type: str = "model", **kwargs): ...


def _needs_hub(name, scope="function"):
    @pytest.fixture(name=name, scope=scope)
    def fixture():
        pytest.skip(f"fixture {name!r} needs the Hub (network); not available to tests/upstream/run.py")

    return fixture


api = _needs_hub("api", "session")
api_prod = _needs_hub("api_prod", "session")
repo_factory = _needs_hub("repo_factory")

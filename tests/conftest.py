"""Shared fixtures: a built wheel, fresh virtual environments, and the hostile filesystems."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import DATASETS_REQ, ROOT, Venv, make_venv
from helpers.perrun import built_once_per_run

pytest_plugins = ["harness.plugin", "harness.realfs"]

# tests/upstream/ holds the runner of the frameworks' own suites (CI calls `python
# tests/upstream/run.py`) and their glue (a `tests` package each): never part of this run.  Not a
# conftest.py of its own there: a second module named `conftest` would shadow this one.
collect_ignore = ["upstream"]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests marked ``long`` first; then each test's xdist_group in its node id.

    pytest-xdist hands each worker the next test (or group) in collection order as it frees up: a test
    of several minutes that starts when the rest are nearly done runs alone at the end, one worker busy
    and the others idle.  Started first, it runs while the short tests fill the other workers.

    Put each test's xdist_group into its node id, as pytest-xdist 3.8 means to under --dist loadgroup.

    xdist appends ``@<group>`` to ``item._nodeid`` in each worker, and its scheduler keeps the tests
    of a group on one worker by that suffix; pytest 9.2 keeps the id in ``item._id`` and ignores
    ``_nodeid``, so every xdist_group was silently spread over all workers.  Only where xdist
    did not (an older pytest already has the suffix).
    """
    items.sort(key=lambda item: item.get_closest_marker("long") is None)
    if not getattr(config.option, "loadgroup", False):
        return
    try:
        from _pytest.nodeid import NodeId
    except ImportError:  # a pytest before 9.2: xdist's own suffix works there
        return
    for item in items:
        groups = sorted({str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                         for mark in item.iter_markers("xdist_group")})
        if groups and "@" not in item.nodeid and hasattr(item, "_id"):
            item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(groups)}")


@pytest.fixture(autouse=True)
def _sharedfs_records_reach_caplog(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once sharedfs activates in a process it gives its logger a stderr handler and stops propagation
    (runtime._ensure_handler); in the test process, whichever test activated it first, caplog must
    still see sharedfs's records."""
    monkeypatch.setattr(logging.getLogger("sharedfs"), "propagate", True)


@pytest.fixture(scope="session")
def sharedfs_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This checkout as a wheel, built once per run: under pytest-xdist the workers share one file.

    One file, not one per worker: the framework venvs (sharedfs.demo.frameworkvenv) reinstall
    sharedfs whenever the wheel's bytes differ, and a wheel built twice differs (its timestamps) --
    a worker would reinstall it under another worker's running job.
    """
    def build(out: Path) -> None:
        proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr

    (wheel,) = built_once_per_run(tmp_path_factory, "sharedfs-wheel", build).glob("sharedfs-*.whl")
    return wheel


@pytest.fixture(scope="session")
def datasets_venv(tmp_path_factory: pytest.TempPathFactory, sharedfs_wheel: Path) -> Venv:
    """A fresh venv with the sharedfs wheel and real Hugging Face datasets installed."""
    return make_venv(tmp_path_factory.mktemp("venv") / "datasets", str(sharedfs_wheel), DATASETS_REQ)


@pytest.fixture
def fresh_runtime(monkeypatch: pytest.MonkeyPatch):
    """The in-process sharedfs state with a clean environment, restored afterwards.

    Yields a namespace with the runtime's functions (``policy``, ``registry``, ``identity``)
    and ``configure``, so tests read as the public API does.
    """
    import types

    from sharedfs.machinery import choices, runtime
    from sharedfs.startup import activation
    for key in list(os.environ):
        if key.startswith(("SHAREDFS_", "SLURM")):
            monkeypatch.delenv(key)
    saved = runtime._state, activation._states
    runtime._state, activation._states = None, None
    choices.forget()
    api = types.SimpleNamespace(policy=runtime.policy, registry=runtime.registry, identity=runtime.identity,
                                configure=activation.configure, runtime=runtime)
    yield api
    runtime._state, activation._states = saved
    choices.forget()

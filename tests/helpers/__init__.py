"""Everything the tests share besides fixtures (those are in tests/conftest.py), in one package.

Tests import from here, never from ``conftest``::

    from helpers import ROOT, Venv, clean_env, make_venv, require
    from helpers.unixusers import throwaway_users

Naming: a module a test imports is named for what it provides (``env``, ``venvs``,
``unixusers``, ``locktools``, ``contract_checks``, ``shardcache_support``); a program a test
runs in a child process by its path ends in ``worker`` (``lockworker.py``, ``mxworker.py``,
``chaosworker.py``, ``olmoworker.py`` with its pins ``olmo_requirements.txt``) or, for the XTuner stack's programs, configs and pins, starts with ``xt_``.
:data:`HELPERS` is this folder, for those paths.
"""

from __future__ import annotations

from pathlib import Path

from helpers.env import ROOT, clean_env, require
from helpers.venvs import DATASETS_REQ, Venv, make_venv

__all__ = ["DATASETS_REQ", "HELPERS", "ROOT", "Venv", "clean_env", "make_venv", "require"]

#: This folder: the worker programs and the XTuner files are run or read from here by path.
HELPERS = Path(__file__).resolve().parent

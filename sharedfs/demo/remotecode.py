"""A tiny offline hub cache holding remote-code models, and the rank that loads them.

``make_repo`` writes what ``hf_hub_download`` finds with ``HF_HUB_OFFLINE=1``: ``models--<org>--<name>``
with ``refs/main`` and a snapshot holding ``config.json`` (an ``auto_map`` naming a class in the repo)
and the module with it.  The module has a realistic size (remote-code configuration and modelling files
are 20-400 kB) and a relative import (``from .helpers import ...``), as Kimi's, Phi's or DeepSeek's do;
the class it defines comes last, so a module read short lacks it.

Run as a module, it is one rank of a job: ``python -m sharedfs.demo.remotecode SYNC REPO...``.  It
imports transformers, then for each repo waits for ``SYNC/go-<i>`` (the test starts every rank's load at once), loads
``AutoConfig.from_pretrained(repo, trust_remote_code=True)`` and prints one JSON line per repo:
``{"repo": ..., "ok": true}`` or the exception's type and message.  With ``SHAREDFS_TEST_STAGGER_MS=N`` rank
``i`` (``SHAREDFS_TEST_INDEX``) starts its load ``i * N`` ms after the go: ranks that arrive one after another,
as on a real job, rather than all at once (where every node writes its copy in the same instant).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import traceback
from pathlib import Path

#: Lines of padding: about 200 kB of module.
PADDING = 2400


def module_source(name: str, padding: int = PADDING) -> str:
    lines = [f'"""Configuration of the {name} remote-code model (generated for sharedfs\'s tests)."""',
             "from transformers import PretrainedConfig", "", "from .helpers import SCALE, table", ""]
    for i in range(padding):
        lines.append(f"_ROPE_{i:05d} = ({i}, {i * 7 % 13}, {i * 31 % 97}, {i * 131 % 1009}, 'layer-{i:05d}')")
    lines += ["", "", "class RemoteConfig(PretrainedConfig):", f"    model_type = {name!r}", "",
              "    def __init__(self, hidden_size=8, **kwargs):",
              "        self.hidden_size = hidden_size * SCALE + len(table())",
              "        super().__init__(**kwargs)", ""]
    return "\n".join(lines)


HELPERS = ('"""Helpers imported relatively by the configuration module."""\n\nSCALE = 2\n\n\n'
           "def table():\n    return [1, 2, 3]\n")


def make_repo(hub_cache: Path, repo: str, model_type: str | None = None) -> str:
    """Write ``repo`` (``org/name``) into the hub cache ``hub_cache``; returns its commit hash."""
    org, name = repo.split("/")
    model_type = model_type or f"remote-{name}"
    source = module_source(model_type)
    commit = hashlib.sha1(f"{repo}\n{source}".encode()).hexdigest()
    root = hub_cache / f"models--{org}--{name}"
    snapshot = root / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / "main").write_text(commit)
    config = {"model_type": model_type, "hidden_size": 8,
              "auto_map": {"AutoConfig": "configuration_remote.RemoteConfig"}}
    (snapshot / "config.json").write_text(json.dumps(config))
    (snapshot / "configuration_remote.py").write_text(source)
    (snapshot / "helpers.py").write_text(HELPERS)
    return commit


def await_trial(sync: Path, trial: int, report: dict[str, str], start: str = "go", seconds: float = 120) -> bool:
    """Say this rank is ready for ``trial``, then wait for ``SYNC/<start>-<trial>`` (looked for every 2 ms: a trial's
    ranks start together); False, reported as ``report`` + a TimeoutError line, when it did not come in ``seconds``."""
    (sync / f"ready-{trial}-{os.environ.get('SHAREDFS_TEST_INDEX', '0')}").touch()
    deadline = time.monotonic() + seconds
    while not (sync / f"{start}-{trial}").exists():
        if time.monotonic() > deadline:
            print(json.dumps({**report, "ok": False, "error": "TimeoutError", "message": f"no {start}"}), flush=True)
            return False
        time.sleep(0.002)
    return True


def failure(exc: BaseException) -> dict[str, object]:
    """A failed load as a rank reports it: the exception's type and message, and the last frames it came through."""
    where = traceback.extract_tb(exc.__traceback__)[-3:]
    return {"ok": False, "error": type(exc).__name__, "message": str(exc)[:300],
            "where": [f"{f.filename}:{f.lineno} {f.name}" for f in where]}


def main() -> int:
    sync, repos = Path(sys.argv[1]), sys.argv[2:]
    from transformers import AutoConfig

    rank = os.environ.get("SHAREDFS_TEST_INDEX", "0")
    stagger = int(rank) * float(os.environ.get("SHAREDFS_TEST_STAGGER_MS", "0")) / 1000
    for i, repo in enumerate(repos):
        if not await_trial(sync, i, {"repo": repo}):
            return 1
        time.sleep(stagger)
        try:
            config = AutoConfig.from_pretrained(repo, trust_remote_code=True)
            assert config.hidden_size == 8 * 2 + 3, config.hidden_size
        except Exception as exc:  # noqa: BLE001 - every failure is reported and counted by the test
            print(json.dumps({"repo": repo, **failure(exc)}), flush=True)
        else:
            print(json.dumps({"repo": repo, "ok": True}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A remote-code model updated while the ranks of a job load it (``trust_remote_code=True``).

Real transformers (scripts/requirements-test.txt), 12 real processes on 3 simulated nodes, each loading
``AutoConfig.from_pretrained(target, trust_remote_code=True)`` and nothing else, with
``HF_MODULES_CACHE`` on hostilefs ``nfs-cto+lagging`` (NFS: a node sees a file's data once its writer
closed it; a new name reaches the other nodes after a lag).  The model's configuration module (~200 kB)
imports ``from .helpers import SCALE``; both files say which version they are.  The old version (v1)
is in the module cache already (an earlier job loaded it); the job's ranks start in two waves and the
model is updated to v2 between them, as a training job restarted while someone pushes a fix:

* **a hub repository** (an offline hub cache): a new commit's snapshot appears and ``refs/main``
  moves to it.  transformers 5.24.0 resolves the revision once per ``from_pretrained``
  (``resolve_revision``) and keys the module directory by the commit
  (``transformers_modules/<org>/<name>/<commit>/``), so a rank never mixes two commits; but the
  ranks that resolve the new commit fill its new directory together, each copying in place
  (``shutil.copyfile``) what another is importing;
* **a local model directory** refreshed file by file (each file renamed into place, as ``hf download
  --local-dir`` does): transformers 5.24.0 keys its module directory by the directory's name *and a
  hash of the source files* (``transformers_modules/<name>/<hash>/``; releases before keyed it by the
  name only, and copied the new files over the old ones in place), so the new version also gets a new
  directory, filled by the ranks that hash it, together.

Stock (``SHAREDFS_DISABLE=transformers``: everything else of sharedfs on; ``SHAREDFS_DISABLE=1``
fails before that, with ``FileExistsError`` from ``os.makedirs`` on the lagging mount) a rank of those
imports a module another node is still writing: ``AttributeError: module
'transformers_modules....configuration_remote' has no attribute 'RemoteConfig'`` or ``ImportError:
cannot import name 'SCALE' from '....helpers'`` (transformers#22555, TensorRT-LLM PR #17708).  With
sharedfs no rank fails, and every rank's module is one version, whole: the configuration module
and its helpers say the same version, and (hub) it is the commit the directory is named for.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

# Fixtures; tests/conftest.py also loads the plugin, this keeps the file runnable alone.
from harness.plugin import hostile_mount  # noqa: F401
from helpers import HELPERS, require
from helpers import ranks as ranks_helper

from sharedfs.demo import node_env

require("transformers", "needs transformers==5.25.0 (scripts/requirements-test.txt)")

pytestmark = pytest.mark.slow

WORKER = str(HELPERS / "modupdateworker.py")
NODES = ("a", "b", "c") * 4
#: NFS sends a written file's data at close, which takes this long here: a wide window, as on a busy server.
FLUSH_MS = 400
LAG_MS = 1000
#: The ranks of each wave (half of each node's) arrive one after another, this far apart: a rank of a node that
#: copied the new version first imports it while a later rank of another node, which does not see the new name
#: yet, copies it again over it (an O_TRUNC open: every node reads it empty until that close).
STAGGER_S = 0.1
TRIALS = 3
#: At most this many batches of TRIALS for the stock side to show the race.
BATCHES = 4
#: Lines of padding: about 200 kB of configuration module.
PADDING = 2400
#: What ``hidden_size=8`` becomes with each version's helpers.
SIZE = {"v1": 16, "v2": 24}
CONFIG = json.dumps({"model_type": "remote-update", "hidden_size": 8,
                     "auto_map": {"AutoConfig": "configuration_remote.RemoteConfig"}})


def config_source(version: str, model: str) -> str:
    """The configuration module: its version, then padding, then the class (a module read short lacks it)."""
    lines = [f'"""Configuration of the remote-code model {model}, {version} (generated for sharedfs\'s tests)."""',
             "from transformers import PretrainedConfig", "", "from .helpers import SCALE", "",
             f"VERSION = {version!r}", ""]
    for i in range(PADDING):
        lines.append(f"_ROPE_{i:05d} = ({i}, {i * 7 % 13}, {i * 31 % 97}, '{version}-{i:05d}')")
    lines += ["", "", "class RemoteConfig(PretrainedConfig):", "    model_type = 'remote-update'", "",
              "    def __init__(self, hidden_size=8, **kwargs):",
              "        self.hidden_size = hidden_size * SCALE",
              "        super().__init__(**kwargs)", ""]
    return "\n".join(lines)


def helpers_source(version: str, model: str) -> str:
    scale = SIZE[version] // 8
    return f'"""Helpers of the remote-code model {model}, {version}."""\n\nVERSION = {version!r}\nSCALE = {scale}\n'


def publish(path: Path, text: str) -> None:
    """Write ``path`` as ``hf download --local-dir`` does: a temporary file, then renamed onto the name."""
    temp = path.with_name(f".{path.name}.incomplete")
    temp.write_text(text)
    os.replace(temp, path)


def write_model(directory: Path, version: str, model: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    publish(directory / "config.json", CONFIG)
    publish(directory / "helpers.py", helpers_source(version, model))
    publish(directory / "configuration_remote.py", config_source(version, model))


def commit_of(repo: str, version: str) -> str:
    return hashlib.sha1(f"{repo}\n{version}".encode()).hexdigest()


def write_commit(hub: Path, repo: str, version: str) -> None:
    """A commit of ``repo`` in the offline hub cache, made the one ``refs/main`` names."""
    org, name = repo.split("/")
    root = hub / f"models--{org}--{name}"
    write_model(root / "snapshots" / commit_of(repo, version), version, repo)
    (root / "refs").mkdir(exist_ok=True)
    publish(root / "refs" / "main", commit_of(repo, version))


class Job:
    """One side's targets (v1 written, and loaded once), its 12 ranks, and the update of each trial's model."""

    def __init__(self, shape: str, mount_path: Path, backing: Path, tmp: Path, label: str, disable: str) -> None:
        self.shape, self.tmp, self.label = shape, tmp, label
        self.hub = tmp / "hub"
        self.env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(self.hub),
                    "HF_HUB_DISABLE_TELEMETRY": "1", "TRANSFORMERS_VERBOSITY": "error",
                    "HF_HOME": str(backing / "home"), "HF_MODULES_CACHE": str(mount_path / "modules"),
                    "SHAREDFS_DISABLE": disable}

    def targets(self, batch: int, trials: int) -> list[str]:
        names = [f"{self.label}-b{batch}m{i}" for i in range(trials)]
        if self.shape == "hub":
            return [f"acc/{name}" for name in names]
        return [str(self.tmp / "models" / name / "remote-model") for name in names]  # one directory name, as is usual

    def write(self, target: str, version: str) -> None:
        if self.shape == "hub":
            write_commit(self.hub, target, version)
        else:
            write_model(Path(target), version, target)

    def run(self, batch: int, trials: int = TRIALS) -> list[dict[str, object]]:
        """Every rank's result of each of the ``trials`` of ``batch``."""
        targets = self.targets(batch, trials)
        for target in targets:
            self.write(target, "v1")
        # The old version is in the module cache: an earlier job (one process) loaded it.
        sync = self.tmp / f"sync-{self.label}-{batch}"
        (sync / "earlier").mkdir(parents=True)
        for i in range(len(targets)):
            (sync / "earlier" / f"go-{i}").touch()
        earlier = subprocess.run([sys.executable, WORKER, str(sync / "earlier"), "1", "0", *targets], capture_output=True,
                                 text=True, env=node_env("a", self.env), timeout=600)
        loaded = [json.loads(line) for line in earlier.stdout.splitlines() if line.startswith("{")]
        assert [r.get("config") for r in loaded] == ["v1"] * len(targets), (loaded, earlier.stderr[-3000:])

        half = len(NODES) // 2
        ranks = [subprocess.Popen([sys.executable, WORKER, str(sync), "1" if i < half else "2",
                                   str((i % half) * STAGGER_S), *targets],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=node_env(node, self.env, SHAREDFS_TEST_INDEX=i))
                 for i, node in enumerate(NODES)]
        try:
            for trial, target in enumerate(targets):
                deadline = ranks_helper.go(sync, ranks, trial)
                # The update lands once the first wave has loaded the old version (a rank reading the model while
                # it is replaced file by file would hash a mix of both, whatever the module cache does), and the
                # second wave starts on it.
                ranks_helper.wait_for_files(sync, f"done-{trial}-*", half, ranks[:half],
                                            "first-wave ranks done with the old version", deadline)
                self.write(target, "v2")
                (sync / f"updated-{trial}").touch()
            return ranks_helper.results(ranks, len(targets), timeout=600)
        finally:
            ranks_helper.end(ranks)

    def whole(self, result: dict[str, object]) -> bool:
        """Whether a rank's module is one version, whole (hub: the commit its directory is named for)."""
        version = result["config"]
        if version not in SIZE or result["helpers"] != version or result["size"] != SIZE[version]:
            return False
        return self.shape != "hub" or commit_of(str(result["target"]), str(version)) in str(result["module"])


@pytest.mark.long
@pytest.mark.parametrize("shape", ["hub", "local"])
def test_a_model_updated_while_twelve_ranks_load_it_fails_stock_and_never_with_sharedfs(
        hostile_mount, tmp_path: Path, shape: str) -> None:
    m = hostile_mount("nfs-cto+lagging", lag_ms=LAG_MS, flush_ms=FLUSH_MS)
    failures: dict[str, Counter[str]] = {}
    versions: dict[str, Counter[str]] = {}
    for label, disable in (("before", "transformers"), ("sharedfs", "")):
        job = Job(shape, m.path, m.backing, tmp_path, label, disable)
        failures[label], versions[label] = Counter(), Counter()
        # Stock: batches of TRIALS until the race shows (on a loaded machine the ranks drift apart and one
        # batch may miss it), at most BATCHES; with sharedfs: one batch of twice as many trials (the same
        # ranks through all of them: a rank's start, importing transformers and torch, is most of its CPU).
        for batch in range(BATCHES if label == "before" else 1):
            trials = TRIALS if label == "before" else 2 * TRIALS
            results = job.run(batch, trials)
            assert len(results) == len(NODES) * trials
            for r in results:
                if not r["ok"]:
                    failures[label][f"{r['error']}: {str(r['message'])[:150]}"] += 1
                elif job.whole(r):
                    versions[label][str(r["config"])] += 1
                else:
                    failures[label][f"a mix: {r}"] += 1
            if label == "before" and failures[label]:
                break
    # Before: a rank imported the new version's module while another node was still writing it.
    before = failures["before"]
    assert sum(before.values()) >= 1, f"the race did not show: stock never imported a module being written {versions}"
    assert all(text.startswith(("AttributeError", "ImportError", "ModuleNotFoundError", "SyntaxError", "NameError",
                                "a mix")) for text in before), before
    # With sharedfs: no failure, each rank one version whole; the update landed while the job loaded (both seen).
    assert failures["sharedfs"] == Counter(), failures["sharedfs"]
    assert versions["sharedfs"]["v1"] >= 1 and versions["sharedfs"]["v2"] >= 1, versions["sharedfs"]

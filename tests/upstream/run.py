#!/usr/bin/env python3
"""Run the patched frameworks' OWN test suites twice: without sharedfs and with it.

For every framework sharedfs patches, at the release CI pins, this downloads the source
distribution from the package index (``pip download --no-binary :all: --no-deps``), unpacks it,
adds the glue the sdist lacks (tests/upstream/glue/, written for this project), and runs the
modules that exercise what sharedfs patches (for a suite whose tests moved between releases,
those of the first Layout the sdist ships: filelock's since 4.3 are tests/core and tests/native):

* once with ``SHAREDFS_DISABLE=1`` (sharedfs installs nothing: the baseline), and
* once with sharedfs active and ``SHAREDFS_STRICT=1`` (an internal shim error raises).

Tests that need the Hub are deselected (deselect.txt, one reason each); the webdataset and wids
tests that curl shards from storage.googleapis.com run against a local HTTPS mirror
(glue/mirror.py: curl's CURL_HOME/.curlrc points the host at 127.0.0.1).  Any other network
access from the tests' Python code is refused at once (glue/_plugin), in both modes.

The two sets of failing test ids must be identical.  A test that fails in one mode only is run
again alone in both modes (``--confirm``, default 2 tries); it counts as a difference if it
fails the same way again, and as flaky (printed, not counted) if it never does.

Exit status: 0 the failing sets agree; 1 they differ (the ids are printed, those failing only
with sharedfs first); 2 a suite could not run (download, collection error, no tests, timeout, or
sharedfs was not active when it should have been / active when it should not).

    .venv/bin/python tests/upstream/run.py [--results upstream.json] [--json] [--only datasets]

Environment: SHAREDFS_UPSTREAM_CACHE (default /var/tmp/sharedfs-upstream) holds the sdists, the
unpacked sources and every run's tree, log and junit xml.  SHAREDFS_* variables of the caller are
not passed to the suites: each mode sets its own.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
GLUE = HERE / "glue"
PLUGIN_DIR = GLUE / "_plugin"
DESELECT_FILE = HERE / "deselect.txt"
REQUIREMENTS = HERE / "requirements.txt"
BUILD_CONSTRAINTS = HERE / "build-constraints.txt"
#: The main environment's pins (scripts/pin.sh): the suites' own test dependencies install under them.
MAIN_PINS = HERE.parent.parent / "scripts" / "constraints.txt"
DEFAULT_CACHE = "/var/tmp/sharedfs-upstream"

MODES = ("baseline", "sharedfs")
MODE_ENV = {
    "baseline": {"SHAREDFS_DISABLE": "1"},
    "sharedfs": {"SHAREDFS_STRICT": "1"},
}


@dataclasses.dataclass
class Layout:
    """One arrangement of a suite's tests in its sdists; run.py takes the first one an sdist ships whole.

    A suite whose project reorganised its tests (filelock 4.3 split tests/test_filelock.py into
    tests/core/, tests/native/, ...) lists each arrangement, newest first, so the runner reads the
    release installed whichever it is.  deselect.txt keys a layout's entries ``SUITE/NAME``.
    """

    name: str
    modules: list[str]  # test files or directories, relative to the sdist root
    #: Files under ``modules`` not collected at all (pytest --ignore), each with the reason.
    ignore: dict[str, str] = dataclasses.field(default_factory=dict)
    #: An older arrangement no new release will ship: its deselections cover several releases, so
    #: one naming a test this release lacks is reported, not an error (in the newest layout it is
    #: an error: a test renamed upstream).
    historic: bool = False


@dataclasses.dataclass
class Suite:
    name: str  # the framework, as in deselect.txt and the results
    dist: str  # its distribution on the package index
    version: str | None  # the release CI pins; None: whatever is installed
    modules: list[str]  # test files (relative to the sdist root) that exercise sharedfs's patches
    why: str  # which sharedfs behaviour those modules exercise
    import_names: list[str]  # where to look for sharedfs's replacements
    prepare: list[str] = dataclasses.field(default_factory=list)  # glue scripts run with the tree as argument
    pytest_args: list[str] = dataclasses.field(default_factory=list)
    mirror: bool = False  # serve the tests' remote shards from 127.0.0.1 (glue/mirror.py)
    #: Instead of ``modules``: the arrangements its releases ship, newest first (see Layout).
    layouts: list[Layout] = dataclasses.field(default_factory=list)


SUITES = [
    Suite(
        name="filelock",
        dist="filelock",
        version=None,  # the release installed (sharedfs's own dependency)
        modules=[],  # chosen from layouts by what the sdist ships
        layouts=[
            # filelock >= 4.3: FileLock's contract is split by subject.  core/: BaseFileLock's
            # acquire, release, re-entrancy, timeouts, threads, forks, signals, on_acquired,
            # relative paths; native/: the Unix lock file (open, modes, identity, fallback, release).
            # The other directories test other classes (SoftFileLock, ReadWriteLock, the async
            # locks), which sharedfs does not replace.
            Layout("split", ["tests/core", "tests/native"], ignore={
                "tests/core/test_fork_async_backends.py": "BaseAsyncFileLock across fork, with pytest-asyncio (not "
                                                          "installed): sharedfs replaces no async lock",
            }),
            # filelock <= 4.2 (3.19, 3.23 and 4.2 in the compatibility matrix and older images).
            Layout("single", ["tests/test_filelock.py"], historic=True),
        ],
        why="the lock class sharedfs hands frameworks (drop_in of filelock.FileLock), judged by filelock's own tests",
        import_names=["filelock"],
        # Its pyproject.toml configures pytest-asyncio, which the tests run here do not use; with its
        # filterwarnings=error the unknown option would end the run before the first test.
        pytest_args=["-p", "sharedfs_filelock_dropin", "-W", "ignore::pytest.PytestConfigWarning"],
    ),
    Suite(
        name="datasets",
        dist="datasets",
        version="5.2.0",
        modules=[
            "tests/test_filelock.py",  # datasets.utils._filelock.FileLock: the lock sharedfs replaces
            "tests/test_builder.py",  # download_and_prepare under the builder lock, cache dirs, reload
            "tests/test_load.py",  # load_dataset / load_dataset_builder through the cache
            "tests/test_arrow_dataset.py",  # Dataset.map caching (the map lock), pickling, save/load
            "tests/test_dataset_dict.py",  # DatasetDict.map caching, serialization
            "tests/test_table.py",  # MemoryMappedTable pickling (__getstate__/__setstate__ replaced)
            "tests/test_fingerprint.py",  # fingerprints must not change with sharedfs's map/pickle wrappers
            "tests/test_arrow_reader.py",  # memory-mapped reads of cached Arrow files
            "tests/test_file_utils.py",  # cached_path / get_from_cache under the download lock
            "tests/test_download_manager.py",  # download + extract into the cache
            "tests/test_extract.py",  # extraction under the extract lock (utils.extract.FileLock)
            "tests/test_py_utils.py",  # multiprocess helpers map() uses
        ],
        why="every datasets lock, the Dataset.map lock, MemoryMappedTable pickling, cache placement",
        import_names=["datasets"],
    ),
    Suite(
        name="huggingface_hub",
        dist="huggingface_hub",
        version=None,  # the release installed with datasets
        modules=[
            "tests/test_utils_fixes.py",  # WeakFileLock itself (replaced)
            "tests/test_file_download.py",  # hf_hub_download's blob/lock/cache logic (offline parts)
            "tests/test_local_folder.py",  # local-dir downloads and their locks
            "tests/test_shared_blobs.py",  # hub 2.x shared xet blob store (its FileLock replaced)
            "tests/test_utils_cache.py",  # scan/delete of the cache layout the locks live in
            "tests/test_snapshot_download.py",  # snapshot_download (offline parts)
        ],
        why="WeakFileLock and the shared-blob FileLock through sharedfs.lock, the hub cache layout",
        import_names=["huggingface_hub"],
    ),
    Suite(
        name="webdataset",
        dist="webdataset",
        version="1.0.2",
        modules=[
            "tests/test_cache.py",  # FileCache, download (remote: local mirror), LRUCleanup (all patched)
            "tests/test_gopen.py",  # gopen, which the patched download calls
            "tests/test_shardlists.py",  # shard lists feeding the cache
            "tests/test_writer.py",  # TarWriter: the shards the cache serves
            "tests/test_utils.py",
        ],
        why="one download per shard (FileCache, download), in-use-safe LRUCleanup, cache dir",
        import_names=["webdataset"],
        mirror=True,
    ),
    Suite(
        name="wids",
        dist="wids",
        version="0.1.11",
        modules=[
            "tests/test_wids.py",  # LRUShards.get_shard / ShardListDataset: download_and_open + locks
            "tests/test_wids_cleanup.py",  # keep_most_recent_files (replaced: in-use-safe)
            "tests/test_wids_dl.py",  # download_and_open + ULockFile, 10 processes at once (local mirror)
            "tests/test_wids_lru.py",  # the LRU whose release_handler is replaced
            "tests/test_wids_mmtar.py",  # memory-mapped shards the cache hands out
        ],
        why="ULockFile that never unlinks, temp + rename downloads, in-use-safe cleanup, cache dir",
        import_names=["wids"],
        prepare=["wids/make_testdata.py"],
        mirror=True,
    ),
    Suite(
        name="mmengine",
        dist="mmengine",
        version="0.10.7",
        modules=[],  # the sdist ships no tests (checked at run time: see below)
        why="fileio, checkpoint, runner resume, hooks",
        import_names=["mmengine"],
    ),
]


# -- small helpers ---------------------------------------------------------------------------------


def log(message: str) -> None:
    print(f"upstream: {message}", file=sys.stderr, flush=True)


def read_deselect(path: Path = DESELECT_FILE) -> dict[str, list[tuple[str, str]]]:
    """SUITE SELECTOR -- REASON lines -> {suite: [(selector, reason)]}.

    SUITE is ``NAME/LAYOUT`` for an entry of one of a suite's layouts (see Layout).
    """
    layouts = {f"{suite.name}/{layout.name}" for suite in SUITES for layout in suite.layouts}
    entries: dict[str, list[tuple[str, str]]] = {}
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        head, sep, reason = line.partition(" -- ")
        fields = head.split()
        if not sep or not reason.strip() or len(fields) != 2:
            raise SystemExit(f"{path}:{number}: expected 'SUITE SELECTOR -- REASON', got {raw!r}")
        if "/" in fields[0] and fields[0] not in layouts:
            raise SystemExit(f"{path}:{number}: no suite layout {fields[0]!r} in tests/upstream/run.py "
                             f"(known: {', '.join(sorted(layouts))})")
        entries.setdefault(fields[0], []).append((fields[1], reason.strip()))
    return entries


def _ships(source: Path, module: str) -> bool:
    return (source / module).is_file() or (source / module).is_dir()


def choose_layout(suite: Suite, source: Path) -> tuple[Layout | None, list[str]]:
    """The first of the suite's layouts the sdist ships whole, and its modules; (None, modules) without layouts."""
    for layout in suite.layouts:
        if all(_ships(source, m) for m in layout.modules):
            return layout, layout.modules
    return None, suite.modules


def stale_deselections(source: Path, modules: list[str],
                       entries: list[tuple[str, str]]) -> tuple[list[str], list[str]]:
    """The entries that cannot apply to this sdist: (misplaced, missing).

    misplaced: the entry's file is not among the modules run or not in the sdist (an entry filed
    under the wrong layout); missing: the file defines no such test or class (renamed or removed
    upstream).  pytest silently ignores a --deselect that matches nothing, so a stale entry would
    otherwise stay in deselect.txt for good, and the test it meant would never be looked at again.
    """
    misplaced, missing = [], []
    for selector, _ in entries:
        if selector.startswith("marker:"):
            continue
        path, _, rest = selector.partition("::")
        if not any(path == m or path.startswith(m.rstrip("/") + "/") for m in modules):
            misplaced.append(f"{selector}: not under the modules run ({', '.join(modules)})")
            continue
        if not (source / path).is_file():
            if rest or not (source / path).is_dir():
                misplaced.append(f"{selector}: the sdist has no file {path}")
            continue
        text = (source / path).read_text(errors="replace")
        for name in (n.split("[", 1)[0] for n in rest.split("::") if n):
            if not re.search(rf"^[ \t]*(?:async[ \t]+def|def|class)[ \t]+{re.escape(name)}\b", text, re.MULTILINE):
                missing.append(f"{selector}: {path} defines no {name}")
                break
    return misplaced, missing


def selection_args(deselected: list[tuple[str, str]]) -> list[str]:
    markers = [s[len("marker:"):] for s, _ in deselected if s.startswith("marker:")]
    args = []
    if markers:
        args += ["-m", " and ".join(f"not {m}" for m in markers)]
    for selector, _ in deselected:
        if not selector.startswith("marker:"):
            args += ["--deselect", selector]
    return args


def installed_version(python: str, dist: str) -> str | None:
    code = "import sys, importlib.metadata as m\ntry: print(m.version(sys.argv[1]))\nexcept Exception: pass"
    out = subprocess.run([python, "-c", code, dist], capture_output=True, text=True,
                         env={**os.environ, "SHAREDFS_DISABLE": "1"})
    return out.stdout.strip() or None


def _sdist_in(directory: Path, dist: str, version: str) -> Path | None:
    wanted = {f"{n}-{version}".lower() for n in (dist, dist.replace("-", "_"), dist.replace("_", "-"))}
    for candidate in sorted(directory.glob("*.tar.gz")):
        if candidate.name[: -len(".tar.gz")].lower() in wanted:
            return candidate
    return None


def download_sdist(python: str, dist: str, version: str, cache: Path) -> Path:
    sdists = cache / "sdists"
    sdists.mkdir(parents=True, exist_ok=True)
    found = _sdist_in(sdists, dist, version)
    if found:
        return found
    log(f"downloading the {dist}=={version} sdist")
    # pip prepares an sdist's metadata even for `download`; mmengine's setup.py imports
    # pkg_resources, which setuptools >= 81 no longer has: build-constraints.txt caps it.
    env = {**os.environ, "PIP_CONSTRAINT": str(BUILD_CONSTRAINTS)}
    cmd = [python, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-binary", ":all:",
           "--no-deps", f"{dist}=={version}", "-d", str(sdists)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    found = _sdist_in(sdists, dist, version)
    if done.returncode != 0 or not found:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        try:
            # pip could not prepare the sdist's metadata (filelock 4.2's build backend needs a hatch
            # plugin the index may not carry); the file itself is all this needs.
            return fetch_sdist(dist, version, sdists)
        except (OSError, ValueError) as error:
            raise RuntimeError(f"pip download {dist}=={version} failed (exit {done.returncode}):\n{tail}\n"
                               f"and from the index's simple page: {error}") from None
    return found


def fetch_sdist(dist: str, version: str, sdists: Path) -> Path:
    """The sdist from the index's simple page (PEP 503), checked against the sha256 the page gives."""
    import hashlib
    import re
    import urllib.parse
    import urllib.request

    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
    project = re.sub(r"[-_.]+", "-", dist).lower()
    with urllib.request.urlopen(f"{index}/{project}/", timeout=60) as response:  # noqa: S310 - the index
        page = response.read(8 << 20).decode("utf-8", "replace")
    names = {f"{n}-{version}.tar.gz".lower() for n in (dist, project, dist.replace("-", "_"))}
    for href in re.findall(r'href="([^"]+)"', page):
        url, _, fragment = href.partition("#")
        name = url.rsplit("/", 1)[-1]
        if name.lower() not in names:
            continue
        if not fragment.startswith("sha256="):
            raise ValueError(f"{name}: the index gives no sha256 to check it against")
        url = urllib.parse.urljoin(f"{index}/{project}/", url)
        with urllib.request.urlopen(url, timeout=300) as response:  # noqa: S310 - the index's file host
            data = response.read(256 << 20)
        if hashlib.sha256(data).hexdigest() != fragment[len("sha256="):]:
            raise ValueError(f"{name}: sha256 differs from the index's")
        target = sdists / name
        partial = target.with_name(name + ".part")
        partial.write_bytes(data)
        partial.replace(target)
        return target
    raise ValueError(f"no {dist}-{version}.tar.gz on {index}/{project}/")


def unpack(sdist: Path, cache: Path) -> Path:
    name = sdist.name[: -len(".tar.gz")]
    target = cache / "src" / name
    stamp = target / ".sharedfs-unpacked"
    if stamp.exists():
        return target / _single_top(target)
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    with tarfile.open(sdist) as archive:
        if hasattr(tarfile, "data_filter"):
            archive.extractall(target, filter="data")
        else:  # Python < 3.8.17 / 3.9.17: no extraction filters; sdists from the index are trusted input
            archive.extractall(target)  # noqa: S202
    stamp.write_text(sdist.name)
    return target / _single_top(target)


def _single_top(target: Path) -> str:
    tops = [p.name for p in target.iterdir() if p.is_dir()]
    if len(tops) != 1:
        raise RuntimeError(f"{target}: expected one top-level directory in the sdist, found {tops}")
    return tops[0]


def overlay_glue(suite: Suite, tree: Path) -> list[str]:
    """Copy glue/<suite>/tests/* into the tree, never over a file the sdist ships."""
    notes = []
    source = GLUE / suite.name / "tests"
    if not source.is_dir():
        return notes
    for path in sorted(source.rglob("*")):
        if path.is_dir() or "__pycache__" in path.parts:
            continue
        relative = path.relative_to(GLUE / suite.name)
        destination = tree / relative
        if destination.exists():
            notes.append(f"the sdist now ships {relative}; glue/{suite.name}/{relative} not used")
            continue
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, destination)
    return notes


def suite_env(mode: str, tree: Path, run_dir: Path, suite: Suite, record: Path, network: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHAREDFS_")}
    env.update(MODE_ENV[mode])
    tmp = run_dir / "tmp"
    for sub in ("tmp", "hf_home", "xdg_cache"):
        (run_dir / sub).mkdir(parents=True, exist_ok=True)
    env.update({
        "SHAREDFS_UPSTREAM_RECORD": str(record),
        "SHAREDFS_UPSTREAM_MODULES": ",".join(suite.import_names),
        "SHAREDFS_UPSTREAM_NETWORK": "1" if network else "0",
        # Each run starts from nothing: its own temp dir (also sharedfs's node-local root), Hugging
        # Face home and cache home, so neither mode sees what the other left behind.
        "TMPDIR": str(tmp),
        "HF_HOME": str(run_dir / "hf_home"),
        "XDG_CACHE_HOME": str(run_dir / "xdg_cache"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        # The sdist's own tests package must win over any other `tests` on sys.path (an editable
        # sharedfs puts its checkout, with its own tests/, on sys.path).
        "PYTHONPATH": os.pathsep.join(p for p in (str(tree), str(PLUGIN_DIR), os.environ.get("PYTHONPATH", "")) if p),
    })
    env.pop("HF_DATASETS_CACHE", None)
    env.pop("HF_HUB_CACHE", None)
    env.pop("WDS_CACHE", None)
    env.pop("WIDS_CACHE", None)
    return env


def run_pytest(python: str, suite: Suite, mode: str, tree: Path, run_dir: Path, targets: list[str],
               selection: list[str], args: argparse.Namespace) -> dict[str, Any]:
    record = run_dir / "record.json"
    junit = run_dir / "junit.xml"
    log_path = run_dir / "pytest.log"
    for stale in (record, junit):
        if stale.exists():
            stale.unlink()
    cmd = [python, "-m", "pytest", "-p", "no:cacheprovider", "-p", "sharedfs_upstream",
           "--timeout", str(args.test_timeout), "--junitxml", str(junit), "-rA",
           "--basetemp", str(run_dir / "pytest-tmp"), *selection, *suite.pytest_args, *targets]
    env = suite_env(mode, tree, run_dir, suite, record, args.network)
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        mirror = None
        if suite.mirror:
            try:
                mirror = stack.enter_context(load_glue("mirror").Mirror(run_dir))
            except (RuntimeError, OSError, subprocess.SubprocessError) as error:
                return {"returncode": None, "seconds": 0.0, "log": str(log_path), "junit": str(junit),
                        "problem": f"could not start the local mirror (glue/mirror.py): {error}"}
            env.update(mirror.env)
        returncode, timed_out = _pytest_process(cmd, tree, env, log_path, args.suite_timeout)
    seconds = round(time.monotonic() - started, 1)
    result: dict[str, Any] = {"returncode": returncode, "seconds": seconds, "log": str(log_path),
                              "junit": str(junit), "problem": None,
                              "mirror_requests": len(mirror.requests) if mirror is not None else None}
    if timed_out:
        result["problem"] = f"timed out after {args.suite_timeout} s (see {log_path})"
        return result
    return _check_record(result, record, returncode, mode, log_path)


def load_glue(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"sharedfs_upstream_glue_{name}", GLUE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pytest_process(cmd: list[str], tree: Path, env: dict[str, str], log_path: Path, timeout: int) -> tuple[int, bool]:
    with open(log_path, "w") as out:
        out.write("$ " + " ".join(cmd) + "\n\n")
        out.flush()
        process = subprocess.Popen(cmd, cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            return process.wait(timeout=timeout), False
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return -9, True


def _check_record(result: dict[str, Any], record: Path, returncode: int, mode: str, log_path: Path) -> dict[str, Any]:
    if not record.exists():
        result["problem"] = f"pytest exited {returncode} without a record (see {log_path})"
        return result
    data = json.loads(record.read_text())
    result.update(data)
    if data["collection_errors"]:
        first = next(iter(data["collection_errors"].items()))
        result["problem"] = (f"{len(data['collection_errors'])} collection error(s), first {first[0]}: "
                             f"{first[1].splitlines()[-1] if first[1] else ''}")
    elif returncode not in (0, 1):
        result["problem"] = f"pytest exited {returncode} (see {log_path})"
    elif not data["tests"]:
        result["problem"] = "no test ran"
    elif mode == "baseline" and data["sharedfs_replacements"]:
        result["problem"] = f"SHAREDFS_DISABLE=1 but sharedfs replaced {data['sharedfs_replacements'][:3]}"
    elif mode == "sharedfs" and not data["sharedfs_replacements"]:
        result["problem"] = "sharedfs mode, but sharedfs replaced nothing in the framework (autoload not active?)"
    return result


def counts(result: dict[str, Any]) -> dict[str, Any]:
    tests = result.get("tests") or {}
    outcome = [t["outcome"] for t in tests.values()]
    extra = {} if result.get("mirror_requests") is None else {"mirror_requests": result["mirror_requests"]}
    return {**extra,
        "selected": len(outcome),
        "passed": outcome.count("passed"),
        "failed": outcome.count("failed"),
        "skipped": outcome.count("skipped"),
        "deselected": result.get("deselected"),
        "seconds": result.get("seconds"),
    }


def failing(result: dict[str, Any]) -> set[str]:
    return {nodeid for nodeid, t in (result.get("tests") or {}).items() if t["outcome"] == "failed"}


def fresh_tree(suite: Suite, source: Path, run_dir: Path) -> tuple[Path, list[str]]:
    if run_dir.exists():
        shutil.rmtree(run_dir)
    tree = run_dir / "src"
    shutil.copytree(source, tree, symlinks=True)
    notes = overlay_glue(suite, tree)
    return tree, notes


def prepare_tree(python: str, suite: Suite, tree: Path) -> None:
    for script in suite.prepare:
        env = {**os.environ, "SHAREDFS_DISABLE": "1"}
        subprocess.run([python, str(GLUE / script), str(tree)], check=True, env=env, timeout=300)


# -- one framework -----------------------------------------------------------------------------------


def run_suite(python: str, suite: Suite, cache: Path, deselect: dict[str, list[tuple[str, str]]],
              args: argparse.Namespace) -> dict[str, Any]:
    report: dict[str, Any] = {"suite": suite.name, "dist": suite.dist, "why": suite.why, "modules": suite.modules,
                              "notes": []}
    installed = installed_version(python, suite.dist)
    version = suite.version or installed
    report["version"] = version
    report["installed"] = installed
    if installed is None:
        report["status"] = "error"
        report["problem"] = f"{suite.dist} is not installed in {python}"
        return report
    if version != installed:
        report["status"] = "error"
        report["problem"] = f"CI pins {suite.dist}=={version} but {installed} is installed: its tests would not match"
        return report
    try:
        sdist = download_sdist(python, suite.dist, version, cache)
        source = unpack(sdist, cache)
    except (RuntimeError, subprocess.SubprocessError, OSError, tarfile.TarError) as error:
        report["status"] = "error"
        report["problem"] = f"could not get the sdist: {error}"
        return report
    report["sdist"] = sdist.name
    layout, modules = choose_layout(suite, source)
    if suite.layouts and layout is None:
        report["status"] = "error"
        report["problem"] = (f"{sdist.name} ships none of the test layouts tests/upstream/run.py knows for "
                             f"{suite.name}: " + "; ".join(
                                 f"{each.name}: {[m for m in each.modules if not _ships(source, m)]} missing"
                                 for each in suite.layouts))
        return report
    report["modules"] = modules
    if layout is not None:
        report["layout"] = layout.name
    shipped = [m for m in modules if _ships(source, m)]
    has_tests = any((source / d).is_dir() for d in ("tests", "test"))
    if not modules:
        if has_tests:
            report["status"] = "error"
            report["problem"] = (f"{sdist.name} now ships tests: choose the modules for {suite.name} in "
                                 "tests/upstream/run.py")
        else:
            report["status"] = "no-tests"
            report["problem"] = (f"{sdist.name} ships no tests (no tests/ directory); "
                                 "nothing of upstream's suite can run")
        return report
    missing = sorted(set(modules) - set(shipped))
    if missing:
        report["status"] = "error"
        report["problem"] = f"{sdist.name} does not ship {missing}"
        return report

    selected_deselect = deselect.get(suite.name, [])
    if layout is not None:
        selected_deselect = selected_deselect + deselect.get(f"{suite.name}/{layout.name}", [])
        misplaced, gone = stale_deselections(source, modules, selected_deselect)
        misplaced += [f"--ignore {path}: the sdist has no such file" for path in layout.ignore
                      if not (source / path).is_file()]
        if gone and layout.historic:
            # The layout's entries cover several releases: one a release lacks is not stale.
            report["notes"] += [f"deselect.txt {suite.name}/{layout.name}: {g} (in another release)" for g in gone]
            gone = []
        if misplaced or gone:
            report["status"] = "error"
            report["problem"] = (f"stale deselections for {sdist.name} ({suite.name}/{layout.name} in "
                                 f"deselect.txt): " + "; ".join(misplaced + gone))
            return report
    report["deselect"] = [{"selector": s, "reason": r} for s, r in selected_deselect]
    selection = selection_args(selected_deselect)
    if layout is not None:
        report["ignored"] = [{"path": path, "reason": why} for path, why in layout.ignore.items()]
        selection += [f"--ignore={path}" for path in layout.ignore]
    runs: dict[str, dict[str, Any]] = {}
    for mode in MODES:
        run_dir = cache / "runs" / f"{suite.name}-{version}" / mode
        tree, notes = fresh_tree(suite, source, run_dir)
        report["notes"] = sorted(set(report["notes"]) | set(notes))
        prepare_tree(python, suite, tree)
        log(f"{suite.name} {version}: {mode} ...")
        runs[mode] = run_pytest(python, suite, mode, tree, run_dir, modules, selection, args)
        c = counts(runs[mode])
        log(f"{suite.name} {version}: {mode}: {c['passed']} passed, {c['failed']} failed, "
            f"{c['skipped']} skipped in {runs[mode]['seconds']} s"
            + (f"  PROBLEM: {runs[mode]['problem']}" if runs[mode]["problem"] else ""))
    report["counts"] = {mode: counts(runs[mode]) for mode in MODES}
    report["sharedfs_replacements"] = runs["sharedfs"].get("sharedfs_replacements", [])
    report["sharedfs_file"] = runs["sharedfs"].get("sharedfs_file")
    report["logs"] = {mode: runs[mode]["log"] for mode in MODES}
    problems = {mode: runs[mode]["problem"] for mode in MODES if runs[mode]["problem"]}
    if problems:
        report["status"] = "error"
        report["problem"] = "; ".join(f"{mode}: {p}" for mode, p in problems.items())
        return report

    base, shared = failing(runs["baseline"]), failing(runs["sharedfs"])
    report["failing_in_both"] = sorted(base & shared)
    only = {"sharedfs": sorted(shared - base), "baseline": sorted(base - shared)}
    messages = {mode: {n: runs[mode]["tests"][n]["message"] for n in only[mode]} for mode in MODES}
    confirmed, flaky = confirm(python, suite, version, source, cache, selection, only, args)
    report["only_with_sharedfs"] = [{"id": n, "message": messages["sharedfs"][n]} for n in confirmed["sharedfs"]]
    report["only_without_sharedfs"] = [{"id": n, "message": messages["baseline"][n]} for n in confirmed["baseline"]]
    report["flaky"] = flaky
    report["status"] = "differ" if confirmed["sharedfs"] or confirmed["baseline"] else "same"
    return report


def confirm(python: str, suite: Suite, version: str, source: Path, cache: Path, selection: list[str],
            only: dict[str, list[str]], args: argparse.Namespace) -> tuple[dict[str, list[str]], list[dict[str, Any]]]:
    """Run each one-sided failure again alone, in both modes, up to args.confirm times."""
    confirmed: dict[str, list[str]] = {mode: [] for mode in MODES}
    pending = {nodeid: mode for mode in MODES for nodeid in only[mode]}
    if args.confirm <= 0 or not pending:
        return {mode: list(only[mode]) for mode in MODES}, []
    for attempt in range(1, args.confirm + 1):
        if not pending:
            break
        log(f"{suite.name}: rerun {attempt}/{args.confirm} of {len(pending)} one-sided failure(s), both modes")
        rerun: dict[str, dict[str, Any]] = {}
        for mode in MODES:
            run_dir = cache / "runs" / f"{suite.name}-{version}" / f"{mode}-confirm{attempt}"
            tree, _ = fresh_tree(suite, source, run_dir)
            prepare_tree(python, suite, tree)
            rerun[mode] = run_pytest(python, suite, mode, tree, run_dir, sorted(pending), selection, args)
        for nodeid, failing_mode in list(pending.items()):
            other = "baseline" if failing_mode == "sharedfs" else "sharedfs"
            again = (rerun[failing_mode].get("tests") or {}).get(nodeid, {}).get("outcome")
            other_outcome = (rerun[other].get("tests") or {}).get(nodeid, {}).get("outcome")
            if again == "failed" and other_outcome != "failed":
                confirmed[failing_mode].append(nodeid)
                del pending[nodeid]
    flaky = [{"id": n, "failed_only_in": m, "note": f"did not fail again alone in {args.confirm} rerun(s)"}
             for n, m in sorted(pending.items())]
    return {mode: sorted(v) for mode, v in confirmed.items()}, flaky


# -- output ----------------------------------------------------------------------------------------


def table(reports: list[dict[str, Any]], seconds: float) -> str:
    lines = []
    header = f"{'framework':<16} {'version':<9} {'mode':<9} {'selected':>8} {'passed':>7} {'failed':>7} " \
             f"{'skipped':>7} {'deselected':>10} {'seconds':>8}"
    lines += [header, "-" * len(header)]
    for r in reports:
        if "counts" not in r:
            lines.append(f"{r['suite']:<16} {str(r.get('version')):<9} {r['status'].upper()}: {r.get('problem')}")
            continue
        for mode in MODES:
            c = r["counts"][mode]
            lines.append(f"{r['suite']:<16} {r['version']:<9} {mode:<9} {c['selected']:>8} {c['passed']:>7} "
                         f"{c['failed']:>7} {c['skipped']:>7} {str(c['deselected']):>10} {str(c['seconds']):>8}")
        if r["status"] == "error":
            lines.append(f"{'':<16} ERROR: {r['problem']}")
    lines.append("")
    for r in reports:
        if r.get("status") not in ("same", "differ"):
            continue
        verdict = "same failing set" if r["status"] == "same" else "FAILING SETS DIFFER"
        lines.append(f"{r['suite']} {r['version']}: {verdict}; failing in both modes: {len(r['failing_in_both'])}")
        for entry in r["only_with_sharedfs"]:
            lines.append(f"  FAILS ONLY WITH SHAREDFS: {entry['id']}")
            lines += [f"      {line}" for line in entry["message"].splitlines()[:6]]
        for entry in r["only_without_sharedfs"]:
            lines.append(f"  fails only without sharedfs: {entry['id']}")
            lines += [f"      {line}" for line in entry["message"].splitlines()[:4]]
        for entry in r["flaky"]:
            lines.append(f"  flaky (not counted): {entry['id']} failed only in {entry['failed_only_in']}; {entry['note']}")
        for note in r.get("notes", []):
            lines.append(f"  note: {note}")
    for r in reports:
        if r.get("status") == "no-tests":
            lines.append(f"{r['suite']} {r['version']}: not run: {r['problem']}")
    lines.append(f"\nwall time {seconds:.0f} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", default=sys.executable, help="interpreter to test (default: this one)")
    parser.add_argument("--results", type=Path, help="write the summary (counts per framework and mode) here")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON instead of the table")
    parser.add_argument("--only", action="append", choices=[s.name for s in SUITES], help="run only this suite")
    parser.add_argument("--no-install", action="store_true", help="do not pip install requirements.txt first")
    parser.add_argument("--confirm", type=int, default=2, help="reruns of a one-sided failure (0: none)")
    parser.add_argument("--test-timeout", type=int, default=300, help="seconds per test (pytest-timeout)")
    parser.add_argument("--suite-timeout", type=int, default=1200, help="seconds per suite run")
    parser.add_argument("--network", action="store_true", help="let the suites reach the network (default: loopback only)")
    args = parser.parse_args(argv)

    started = time.monotonic()
    cache = Path(os.environ.get("SHAREDFS_UPSTREAM_CACHE") or DEFAULT_CACHE)
    cache.mkdir(parents=True, exist_ok=True)
    python = args.python
    if not args.no_install:
        log(f"installing {REQUIREMENTS.relative_to(HERE.parent.parent)} into {python}")
        subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "-r", str(REQUIREMENTS),
                        *(["-c", str(MAIN_PINS)] if MAIN_PINS.exists() else [])],
                       check=True, env={**os.environ, "SHAREDFS_DISABLE": "1"})
    deselect = read_deselect()
    reports = []
    for suite in SUITES:
        if args.only and suite.name not in args.only:
            continue
        reports.append(run_suite(python, suite, cache, deselect, args))
    seconds = time.monotonic() - started

    summary = {
        "python": subprocess.run([python, "-c", "import sys; print(sys.version.split()[0])"],
                                 capture_output=True, text=True).stdout.strip(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "wall_seconds": round(seconds, 1),
        "suites": reports,
    }
    errors = [r for r in reports if r["status"] == "error"]
    differ = [r for r in reports if r["status"] == "differ"]
    summary["verdict"] = "error" if errors else "differ" if differ else "same"
    if args.results:
        args.results.parent.mkdir(parents=True, exist_ok=True)
        args.results.write_text(json.dumps(summary, indent=1) + "\n")
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print(table(reports, seconds))
    only_shared = sum(len(r.get("only_with_sharedfs", [])) for r in reports)
    only_base = sum(len(r.get("only_without_sharedfs", [])) for r in reports)
    in_both = sum(len(r.get("failing_in_both", [])) for r in reports)
    print(f"upstream: verdict {summary['verdict']}: {only_shared} test(s) fail only with sharedfs, "
          f"{only_base} only without, {in_both} in both modes; {len(errors)} suite(s) could not run",
          file=sys.stderr)
    if errors:
        return 2
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())

"""What sharedfs costs a process: interpreter start-up, and each framework's first import.

1. ``python -c pass`` in three otherwise identical venvs from this interpreter's base, of two
   flavours (``python -m venv`` with pip and setuptools, and a bare one as ``uv venv`` makes):
   one with the sharedfs wheel installed, one without (the stock figure), and one whose only
   addition is a ``.pth`` file importing an empty top-level module -- the floor: what any
   autoloading package costs before it does anything (virtualenv's ``_virtualenv.pth`` imports
   its module the same way; a ``.pth`` line cannot hold a finder without compiling it at every
   start-up, which costs more than the import).  Wall time, median of ``--runs`` alternating runs per venv;
   goal <= 1.03.  The same three as user-space instructions (valgrind callgrind), which repeat
   exactly on a loaded machine, and the bootstrap's own import time (``-X importtime``).
2. Each framework's first import (datasets, huggingface_hub, webdataset, wids, mmengine, xtuner
   if installed, torch), timed inside the process around the import statement, with sharedfs
   against ``SHAREDFS_DISABLE=1`` in this interpreter's environment, alternating (3x the runs for an
   import under 0.5 s: the same noise in ms is a larger share of it); goal <= 1.03
   (median of the per-pair ratios).  The note gives the CPU-time ratio and what sharedfs's
   activation costs on its own (the framework imported with sharedfs off, then sharedfs enabled
   and timed: the same work the import hook does, without the import's noise).
3. The same imports as user-space instructions (valgrind callgrind; ``--no-callgrind`` skips):
   wall time on a shared 2-core VM moves +-5-12 % between runs of one command, the
   instruction count repeats exactly.  Each side is the count of ``python -c "<import>"``
   minus that of ``python -c pass`` in the same environment, so start-up is not diluting it;
   hash seed and BLAS/OpenMP threads are fixed (numpy's idle BLAS threads spin under valgrind).

    python benchmarks/startup.py [--json] [--quick] [--runs 150] [--import-runs 15] [--only datasets]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import venv
import zipfile
from pathlib import Path

from _common import (
    alternate,
    at_most,
    clean_env,
    emit,
    instructions,
    log,
    median,
    paired_ratio,
    row,
    valgrind,
)

#: benchmarks/run_all.py gives this benchmark this long (seconds) on a quiet 2-core machine.
RUN_ALL_TIMEOUT = 3600

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "benchmarks" / ".work"

#: Framework -> the statement a program starts with.  A lazy facade whose shim target loads on
#: first use gets a second row with the statement that loads it.
FRAMEWORKS = {
    "datasets": "import datasets",
    "huggingface_hub": "import huggingface_hub",
    "huggingface_hub (hf_hub_download)": "from huggingface_hub import hf_hub_download",
    "webdataset": "import webdataset",
    "wids": "import wids",
    "mmengine": "import mmengine",
    "xtuner": "import xtuner.dataset.huggingface",
    "torch": "import torch",
}

IMPORT = textwrap.dedent("""
    import json, sys, time
    statement, activate = sys.argv[1], sys.argv[2] == "activate"
    wall, cpu = time.perf_counter(), time.process_time()
    exec(statement)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    out = {"wall": wall * 1e3, "cpu": cpu * 1e3}
    if activate:  # imported with SHAREDFS_DISABLE=1: now let sharedfs do what its import hook would have done
        import os, _sharedfs_bootstrap
        os.environ.pop("SHAREDFS_DISABLE", None)  # the hook's own path (stand-ins included), not the eager one
        w, c = time.perf_counter(), time.process_time()
        _sharedfs_bootstrap.install_finder(respect_disable=False)
        out["activation_wall"], out["activation_cpu"] = (time.perf_counter() - w) * 1e3, (time.process_time() - c) * 1e3
    print(json.dumps(out))
""")


# -- the venvs -------------------------------------------------------------------------------------

#: Venv flavours: ``python -m venv`` (pip and setuptools, whose distutils-precedence.pth runs at
#: every start-up) and a bare one (no pip, as ``uv venv`` and many cluster images make them).
FLAVOURS = {"pip": True, "bare": False}


def _venv(path: Path, tag: str, with_pip: bool) -> str:
    python = path / "bin" / "python"
    marker = path / ".bench"
    tag = f"{tag} pip={with_pip}"
    if python.exists() and marker.exists() and marker.read_text() == tag:
        return str(python)
    venv.EnvBuilder(with_pip=with_pip, clear=True, symlinks=True).create(path)  # ensurepip: offline
    marker.write_text(tag)
    return str(python)


def _site_packages(venv_dir: Path) -> Path:
    """The venv's own site-packages, never the base interpreter's (the benchmark writes into it)."""
    site = venv_dir / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    if not site.is_dir() or WORK.resolve() not in site.resolve().parents:
        raise SystemExit(f"refusing to install into {site}: not a benchmark venv under {WORK}")
    return site


def build_wheel() -> Path:
    """The sharedfs wheel of this checkout (offline: this environment's hatchling builds it)."""
    out = Path(tempfile.mkdtemp(prefix="sharedfs-wheel-"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "--disable-pip-version-check", "-w", str(out), str(ROOT)], check=True)
    return next(out.glob("sharedfs-*.whl"))


def install_wheel(wheel: Path, site: Path) -> None:
    """Unpack a pure wheel into ``site`` (what an installer does for one; start-up sees the same files)."""
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
        names = [str(site / name) for name in zf.namelist() if name.endswith(".py")]
    subprocess.run([sys.executable, "-m", "py_compile", *names], check=True)


def venvs(flavour: str, wheel: Path) -> dict[str, str]:
    """``without``, ``with`` (the sharedfs wheel) and ``floor`` (a ``.pth`` importing an empty module)."""
    WORK.mkdir(parents=True, exist_ok=True)
    base = f"{sys.version} {getattr(sys, '_base_executable', sys.executable)}"
    with_pip = FLAVOURS[flavour]
    pythons = {name: _venv(WORK / f"{flavour}-{name}", base, with_pip) for name in ("without", "floor", "with")}
    floor_site = _site_packages(WORK / f"{flavour}-floor")
    (floor_site / "zz_floor.pth").write_text("import _zz_floor\n")
    (floor_site / "_zz_floor.py").write_text("")
    subprocess.run([sys.executable, "-m", "py_compile", str(floor_site / "_zz_floor.py")], check=True)
    # The wheel is installed afresh each run: the benchmark measures this checkout, not an old install.
    site = _site_packages(WORK / f"{flavour}-with")
    for old in site.glob("*sharedfs*"):
        shutil.rmtree(old) if old.is_dir() else old.unlink()
    install_wheel(wheel, site)
    return pythons


def timed(python: str, argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run([python, *argv], check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=WORK)
    return time.perf_counter() - start


def startup_rows(args: argparse.Namespace, env: dict[str, str]) -> list[dict]:
    wheel = build_wheel()
    rows = []
    for flavour in FLAVOURS:
        pythons = venvs(flavour, wheel)
        kind = "python -m venv (pip, setuptools)" if FLAVOURS[flavour] else "bare venv (no pip, as uv makes them)"
        check = subprocess.run([pythons["with"], "-c", "import sys, _sharedfs_bootstrap as b; "
                                "print(b.installed(), b.__file__)"], capture_output=True, text=True, env=env, cwd=WORK)
        if not check.stdout.startswith("True"):
            raise SystemExit(f"the venv with sharedfs does not autoload it: {check.stdout}{check.stderr}")
        for python in pythons.values():  # page cache, .pyc files
            for _ in range(3):
                timed(python, ["-c", "pass"], env)
        log(f"python -c pass, {kind}: {args.runs} alternating runs per venv ...")
        floors: list[float] = []

        def with_then_floor(pythons: dict[str, str] = pythons, floors: list[float] = floors) -> float:
            floors.append(timed(pythons["floor"], ["-c", "pass"], env))
            return timed(pythons["with"], ["-c", "pass"], env)

        a, b = alternate(with_then_floor, lambda p=pythons: timed(p["without"], ["-c", "pass"], env), args.runs)
        paired, spread = paired_ratio(a, b)
        floor_paired, _ = paired_ratio(floors, b)
        ours, theirs, floor = median(a) * 1e3, median(b) * 1e3, median(floors) * 1e3
        rows.append(row(f"python -c pass, {kind}, with sharedfs vs without", ours, theirs, "ms", "<= 1.03",
                        at_most(paired, 1.03), ratio=paired, floor=floor,
                        floor_what="the same venv whose only addition is a .pth importing an empty module",
                        samples=len(a), spread=spread,
                        note=f"ratio: median of per-pair ratios; the floor venv / without, the same way: "
                             f"{floor_paired:.3f} (the least any autoloading package costs here)"))
        if args.callgrind and valgrind():
            log(f"python -c pass, {kind}, under callgrind ...")
            counts = {name: instructions([python, "-c", "pass"], env, cwd=str(WORK)) for name, python in pythons.items()}
            ratio = counts["with"] / counts["without"]
            rows.append(row(f"python -c pass, {kind}, instructions (callgrind), with sharedfs vs without",
                            counts["with"], counts["without"], "instr", "<= 1.03", at_most(ratio, 1.03),
                            floor=counts["floor"], floor_what="the venv with a .pth importing an empty module",
                            note=f"sharedfs adds {counts['with'] - counts['without']:,} instructions, of which "
                                 f"{counts['floor'] - counts['without']:,} any autoloading .pth costs"))
    selfs = []
    for _ in range(max(5, args.runs // 4)):
        err = subprocess.run([pythons["with"], "-X", "importtime", "-c", "pass"], env=env, capture_output=True,
                             text=True, cwd=WORK).stderr
        selfs.append(sum(int(line.split("|")[0].split(":")[1]) for line in err.splitlines()
                         if "sharedfs" in line and line.startswith("import time:")))
    rows.append(row("sharedfs modules imported at start-up (-X importtime, self)", median(selfs), None, "us", "-",
                    None, note="only _sharedfs_bootstrap should appear"))
    return rows


# -- first imports ------------------------------------------------------------------------------


def _xtuner_python() -> str | None:
    """The XTuner test venv tests/integration/test_xtuner.py builds (with sharedfs installed), if any."""
    cache = Path(os.environ.get("SHAREDFS_TEST_VENV_CACHE", "/var/tmp/sharedfs-test-venvs"))
    built = sorted(cache.glob("xtuner-*/bin/python"), key=lambda p: p.stat().st_mtime)
    return str(built[-1]) if built else None


def _import(statement: str, env: dict[str, str], activate: bool = False, python: str = sys.executable) -> dict:
    # A neutral working directory: the checkout on sys.path[0] would shadow another venv's sharedfs.
    proc = subprocess.run([python, "-c", IMPORT, statement, "activate" if activate else "-"],
                          capture_output=True, text=True, env=env, cwd=tempfile.gettempdir())
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def import_rows(args: argparse.Namespace, env: dict[str, str]) -> list[dict]:
    rows = []
    off = {**env, "SHAREDFS_DISABLE": "1"}
    for name, statement in FRAMEWORKS.items():
        if args.only and not any(o in name for o in args.only):
            continue
        python = sys.executable
        try:
            try:
                _import(statement, env)  # warm: page cache, .pyc files, and fails fast if not installed
            except RuntimeError:
                other = _xtuner_python() if name == "xtuner" else None
                if other is None:
                    raise
                python = other  # XTuner pins its own stack: its test venv (with sharedfs installed)
                _import(statement, env, python=python)
            _import(statement, off, python=python)
        except RuntimeError as exc:
            log(f"{name}: not measured ({exc})")
            rows.append(row(f"first import: {name} (`{statement}`)", None, None, "ms", "<= 1.03", None,
                            note=f"not installed here: {exc}"))
            continue
        # A short import is as noisy in milliseconds as a long one: 3x the samples under half a second.
        runs = args.import_runs * (3 if _import(statement, off, python=python)["wall"] < 500 else 1)
        log(f"{name}: {runs} alternating imports per side ...")
        a, b = alternate(lambda s=statement, p=python: _import(s, env, python=p),
                         lambda s=statement, p=python: _import(s, off, python=p), runs)
        paired, spread = paired_ratio([x["wall"] for x in a], [y["wall"] for y in b])
        cpu = median([x["cpu"] for x in a]) / median([y["cpu"] for y in b])
        alone = [_import(statement, off, activate=True, python=python) for _ in range(max(3, args.import_runs // 2))]
        act_wall = median([x["activation_wall"] for x in alone])
        act_cpu = median([x["activation_cpu"] for x in alone])
        ours, theirs = median([x["wall"] for x in a]), median([y["wall"] for y in b])
        rows.append(row(f"first import: {name} (`{statement}`), sharedfs vs SHAREDFS_DISABLE=1", ours, theirs, "ms",
                        "<= 1.03", at_most(paired, 1.03), ratio=paired, samples=len(a), spread=spread,
                        activation_ms=act_wall, activation_cpu_ms=act_cpu, cpu_ratio=cpu,
                        note=f"ratio: median of per-pair ratios; CPU-time ratio {cpu:.3f}; sharedfs's activation "
                             f"alone {act_wall:.1f} ms ({act_cpu:.1f} ms CPU) = "
                             f"{act_wall / theirs:.1%} of the stock import"
                             + ("" if python == sys.executable else f"; interpreter {python}")))
    return rows


def _import_instructions(statement: str, env: dict[str, str], python: str) -> int | None:
    """Instructions of ``statement`` in a fresh interpreter: ``python -c statement`` minus ``python -c pass``."""
    cwd = tempfile.gettempdir()
    whole, bare = instructions([python, "-c", statement], env, cwd=cwd), instructions([python, "-c", "pass"], env, cwd=cwd)
    return None if whole is None or bare is None else whole - bare


def import_instruction_rows(args: argparse.Namespace, env: dict[str, str]) -> list[dict]:
    rows: list[dict] = []
    if not valgrind():
        return rows
    off = {**env, "SHAREDFS_DISABLE": "1"}
    # Both sides at once (2 cores): a count does not depend on what else runs.
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        for name, statement in FRAMEWORKS.items():
            if (args.only and not any(o in name for o in args.only)) or name == "xtuner":
                continue  # xtuner: its own venv and a 6 s import, ~10 min under valgrind
            log(f"{name}: instructions of the import, with and without sharedfs (callgrind) ...")
            try:
                ours_f = pool.submit(_import_instructions, statement, env, sys.executable)
                theirs_f = pool.submit(_import_instructions, statement, off, sys.executable)
                ours, theirs = ours_f.result(), theirs_f.result()
            except RuntimeError as exc:
                log(f"{name}: not counted ({str(exc).splitlines()[0]})")
                continue
            if ours is None or theirs is None:
                continue
            ratio = ours / theirs
            rows.append(row(f"first import: {name} (`{statement}`), instructions (callgrind), sharedfs vs "
                            "SHAREDFS_DISABLE=1", ours, theirs, "instr", "<= 1.03", at_most(ratio, 1.03),
                            ratio=ratio, note=f"sharedfs adds {ours - theirs:,} instructions; each side is "
                                              "`python -c <import>` minus `python -c pass`, one run (counts repeat)"))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # python -c pass takes ~15 ms: 150 pairs cost seconds and steady the median on a noisy VM.
    parser.add_argument("--runs", type=int, default=150, help="python -c pass runs per venv")
    parser.add_argument("--import-runs", type=int, default=15, help="imports per side and framework (3x for imports under 0.5 s)")
    parser.add_argument("--only", action="append", help="only frameworks whose name contains this")
    parser.add_argument("--no-startup", dest="startup", action="store_false", help="skip python -c pass")
    parser.add_argument("--no-imports", dest="imports", action="store_false", help="skip the framework imports")
    parser.add_argument("--no-callgrind", dest="callgrind", action="store_false")
    parser.add_argument("--quick", action="store_true", help="a short run to check that everything works")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.import_runs = 8, 3
    env = clean_env()
    rows = (startup_rows(args, env) if args.startup else []) + (import_rows(args, env) if args.imports else [])
    if args.imports and args.callgrind and not args.quick:  # ~10 min under valgrind for all frameworks
        rows += import_instruction_rows(args, env)
    return emit(rows, args.json, "start-up and first imports")


if __name__ == "__main__":
    sys.exit(main())

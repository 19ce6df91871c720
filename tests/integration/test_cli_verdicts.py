"""Verdicts that pointed the wrong way, each shown right: what the command says is what is true.

Each test names what the command said before (on the same input): ``doctor FILE`` probed the file's
path and said "O_EXCL create: NOT exclusive" with a lease to fix it; ``doctor /missing DIR`` stopped
at the first path; a ``WaitTimeout`` sent people to ``sharedfs doctor <a missing path>``; ``status``
under a malformed setting showed every shim "OFF: SHAREDFS_DISABLE"; under ``SHAREDFS_DISABLE=1``
``doctor`` never said sharedfs was off and ``env`` printed exports; ``env --shell zsh`` was refused
though its help named zsh; a misspelt command got no suggestion; ``SHAREDFS_DISABLE=dataset`` passed
silently; ``status`` showed neither the OS, the kernel, filelock nor the patched libraries' versions;
and without wids installed it showed wids's range as webdataset 0.2's.
"""

from __future__ import annotations

import json
import platform
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

from helpers import clean_env

ROOT = Path(__file__).resolve().parents[2]


def sharedfs(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sharedfs", *args], capture_output=True, text=True,
                          env=clean_env(env), timeout=300, check=False)


def python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(env),
                          timeout=300, check=False)


def test_doctor_of_a_file_names_its_directory_instead_of_a_wrong_verdict(tmp_path: Path) -> None:
    # Before: "O_EXCL create: NOT exclusive" and "set SHAREDFS_LOCK=lease", rc 0 (its probes failed with ENOTDIR).
    file = tmp_path / "data.json"
    file.write_text("{}")
    proc = sharedfs("doctor", str(file))
    assert "NOT exclusive" not in proc.stdout and "SHAREDFS_LOCK=lease" not in proc.stdout
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (f"sharedfs doctor: {file}: not a directory: doctor probes the directory a file lives in "
                           f"(it creates its test files there); run `sharedfs doctor {tmp_path}`\n")


def test_doctor_reports_every_usable_path_after_a_missing_one(tmp_path: Path) -> None:
    # Before: rc 2 and nothing at all for the second path.
    missing = tmp_path / "typo" / "cache"
    proc = sharedfs("doctor", str(missing), str(tmp_path))
    assert proc.returncode == 2
    assert proc.stdout.splitlines()[0] == str(tmp_path) and "  filesystem : " in proc.stdout
    assert proc.stderr.splitlines() == [f"sharedfs doctor: {missing}: no such file or directory; the nearest "
                                        f"directory that exists is {tmp_path} (`sharedfs doctor {tmp_path}`)"]
    empty = sharedfs("doctor", "", str(tmp_path))  # `sharedfs doctor "$CACHE"` with CACHE unset
    assert empty.returncode == 2 and empty.stdout.splitlines()[0] == str(tmp_path)
    assert empty.stderr == "sharedfs doctor: an empty PATH (an unset variable in a script?): name the directory to probe\n"
    data = json.loads(sharedfs("doctor", "--json", str(missing), str(tmp_path)).stdout)
    assert [report["path"] for report in data["paths"]] == [str(tmp_path)]
    assert [error["path"] for error in data["errors"]] == [str(missing)]


def test_a_wait_timeout_recommends_a_doctor_command_that_runs(tmp_path: Path) -> None:
    # Before: `sharedfs doctor <tmp_path>/step-100/model`'s parent, step-100, which does not exist: rc 2.
    awaited = tmp_path / "step-100" / "model" / "done"
    proc = python(f"import sharedfs\ntry:\n    sharedfs.wait_for({str(awaited)!r}, timeout=0.2)\n"
                  "except sharedfs.WaitTimeout as exc:\n    print(exc)\n")
    (advised,) = re.findall(r"`sharedfs doctor ([^`]+)`", proc.stdout)
    assert advised == str(tmp_path), proc.stdout
    assert sharedfs("doctor", advised).returncode == 0


def test_status_under_a_malformed_setting_does_not_blame_shared_disable() -> None:
    # Before: every installed shim "OFF: SHAREDFS_DISABLE", though SHAREDFS_DISABLE was not set.
    proc = sharedfs("status", env={"SHAREDFS_LOCK": "bogus"})
    assert "SHAREDFS_DISABLE" not in proc.stdout
    assert proc.returncode == 2
    row = next(line for line in proc.stdout.splitlines() if line.split()[:1] == ["makedirs"])
    assert row.endswith("import torch.distributed fails with the CONFIG ERROR above"), row


def test_doctor_and_env_say_that_sharedfs_is_off(tmp_path: Path) -> None:
    # Before: doctor's verdict read as if sharedfs worked there; env printed its exports.
    off = {"SHAREDFS_DISABLE": "1"}
    proc = sharedfs("doctor", str(tmp_path), env=off)
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    assert lines[1].startswith("  OFF        : sharedfs is OFF here (SHAREDFS_DISABLE=1)"), lines[:3]
    sharedfs_line = next(line for line in lines if line.startswith("  sharedfs   : "))
    assert sharedfs_line.startswith("  sharedfs   : nothing: OFF here"), sharedfs_line
    assert json.loads(sharedfs("doctor", "--json", str(tmp_path), env=off).stdout)["paths"][0]["sharedfs_off"]
    assert sharedfs("doctor", str(tmp_path)).stdout.splitlines()[1].startswith("  filesystem : ")  # on: no OFF line
    env = sharedfs("env", env=off)
    assert env.returncode == 0 and env.stdout == ""
    assert env.stderr == ("sharedfs env: sharedfs is OFF here (SHAREDFS_DISABLE=1): programs use the frameworks' "
                          "own locks; nothing to export\n")
    assert "export " in sharedfs("env").stdout  # on: the exports


def test_env_speaks_every_shell_its_help_names() -> None:
    # Before: `--shell zsh` and `--shell sh` were refused (rc 2), though the help said "bash (also sh, zsh)".
    bash = sharedfs("env").stdout
    assert bash.startswith("export ")
    for shell in ("sh", "zsh"):
        proc = sharedfs("env", "--shell", shell)
        assert proc.returncode == 0 and proc.stdout == bash, proc.stderr
    # and a real POSIX sh (dash) evaluates them
    script = Path(sys.executable).with_name("sharedfs")
    proc = subprocess.run(["sh", "-c", f'exports="$("{script}" env --shell sh)"; eval "$exports"; echo "$WIDS_CACHE"'],
                          capture_output=True, text=True, env=clean_env(), timeout=300, check=False)
    assert proc.returncode == 0 and proc.stdout.startswith("/"), (proc.stdout, proc.stderr)


def test_a_misspelt_command_gets_the_one_meant() -> None:
    # Before: argparse's "invalid choice: 'stauts' (choose from ...)" only.
    proc = sharedfs("stauts")
    assert proc.returncode == 2
    assert "unknown command 'stauts' (did you mean 'status'?)" in proc.stderr
    assert "Traceback" not in proc.stderr
    far = sharedfs("frobnicate")
    assert far.returncode == 2 and "did you mean" not in far.stderr and "the commands: status, doctor" in far.stderr


def test_an_unknown_name_in_shared_disable_is_refused_and_switches_nothing_off(tmp_path: Path) -> None:
    # Before: `SHAREDFS_DISABLE=dataset` was accepted without a word (the datasets shim stayed on by luck of
    # the typo; `SHAREDFS_DISABLE=dataset,wids` as silently), `configure(disable=...)` and the TOML key too.
    typo = {"SHAREDFS_DISABLE": "dataset,wids"}
    status = sharedfs("status", "--json", env=typo)
    assert status.returncode == 2
    error = json.loads(status.stdout)["config_error"]
    assert "SHAREDFS_DISABLE='dataset,wids' is not valid" in error and "unknown: dataset (did you mean datasets?)" in error
    listed = error.split("these names: ", 1)[1].split(" (unknown", 1)[0]
    assert {"datasets", "distributed", "wids", "triton", "transformers"} <= set(listed.split(", ")), listed
    # A program: its import neither fails nor loses the shim the typo missed; the names it knows count.
    code = ("import datasets\nfrom sharedfs.startup import activation\n"
            "states = activation.shim_states()\n"
            "print(states['datasets'].shim.applied, 'wids' in states)\n")
    proc = python(code, env=typo)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "False"]  # datasets patched; wids (named right) off
    (said,) = [line for line in proc.stderr.splitlines() if "SHAREDFS_DISABLE" in line]
    assert said.startswith("sharedfs: SHAREDFS_DISABLE='dataset,wids' is not valid")
    assert said.endswith("; the shims it does not name stay ON")
    # The program's own call is refused, as any other bad value.
    proc = python("import sharedfs\ntry:\n    sharedfs.configure(disable=['dataset'])\n"
                  "except sharedfs.ConfigError as exc:\n    print('refused:', exc)\n")
    assert proc.stdout.startswith("refused: argument disable='dataset' is not valid"), (proc.stdout, proc.stderr)
    # A TOML file's key, named by file and key.
    config = tmp_path / "sharedfs.toml"
    config.write_text('disable = ["dataset"]\n')
    status = sharedfs("status", env={"SHAREDFS_CONFIG": str(config)})
    assert status.returncode == 2 and f"sharedfs status: {config}: disable='dataset' is not valid" in status.stderr
    assert f"fix or remove `disable` in {config}" in status.stderr
    # Known names pass, and "1" still means everything.
    assert sharedfs("status", env={"SHAREDFS_DISABLE": "datasets,mmengine.runner"}).returncode == 0
    assert sharedfs("status", env={"SHAREDFS_DISABLE": "1"}).returncode == 0


def test_status_leads_with_what_a_bug_report_needs(tmp_path: Path) -> None:
    # Before: "sharedfs 0.1.0 (Python 3.11.7)", then autoload: no OS, kernel, filelock or library versions.
    proc = subprocess.run([sys.executable, "-m", "sharedfs", "status"], capture_output=True, text=True,
                          env=clean_env(), cwd=tmp_path, timeout=300, check=False)
    first, libraries, mounts = proc.stdout.splitlines()[:3]
    assert platform.release() in first and platform.machine() in first
    assert f"filelock {version('filelock')}" in libraries and f"datasets {version('datasets')}" in libraries
    assert f"torch {version('torch')}" in libraries
    assert mounts == "mounts (of the paths in use):"
    assert f"{tmp_path} (current directory)" in proc.stdout.split("autoload:")[0]
    data = json.loads(subprocess.run([sys.executable, "-m", "sharedfs", "status", "--json"], capture_output=True,
                                     text=True, env=clean_env(), timeout=300, check=False).stdout)
    assert list(data)[:5] == ["version", "python", "platform", "libraries", "mounts"]
    assert data["platform"]["kernel"] == platform.release()
    assert data["libraries"]["filelock"] == version("filelock")
    assert data["libraries"]["wids"] == version("wids")
    assert {row["what"] for row in data["mounts"]} >= {"node-local root", "current directory", "datasets cache"}


def test_wids_range_is_wids_own_when_wids_is_not_installed(tmp_path: Path) -> None:
    """A login node with webdataset 1.x and no wids (the issue's plain install): status showed ">=0.2,<0.3",
    webdataset 0.2's range, for wids; the demo and README say wids 0.1.x."""
    import shutil

    import packaging
    import pluggy

    site = tmp_path / "site"
    for module in (pluggy, packaging):  # sharedfs's own run-time dependencies, without any dist-info
        shutil.copytree(Path(module.__file__).parent, site / module.__name__)
    (site / "webdataset-1.0.2.dist-info").mkdir(parents=True)
    (site / "webdataset-1.0.2.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: webdataset\n"
                                                                  "Version: 1.0.2\n")
    code = ("import sys; sys.path[:] = [p for p in sys.path if 'site-packages' not in p]\n"
            f"sys.path[:0] = [{str(site)!r}, {str(ROOT / 'autoload' / 'checkout')!r}, {str(ROOT)!r}]\n"
            "from importlib.metadata import version\n"
            "import sharedfs.shims.wids as w\n"
            "shim = w.WidsShim()\n"
            "print(version('webdataset'), shim.distribution, shim.supported)\n")
    proc = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, env=clean_env(),
                          timeout=300, check=False)
    assert proc.stdout.split() == ["1.0.2", "wids", ">=0.1,<0.2"], proc.stderr
    from sharedfs.demo.scenarios import DISTRIBUTIONS

    assert DISTRIBUTIONS["wids"] == "wids>=0.1,<0.2"  # the demo's install hint: the same range

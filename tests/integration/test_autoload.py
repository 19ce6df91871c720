"""User stories of the foundation: `pip install sharedfs` is all a user does.

Every test drives a real virtual environment in real subprocesses.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest
from helpers import Venv, make_venv

# xdist_group: the session's datasets_venv, which some of these tests pip-install into.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("datasets-venv")]

HEAVY = ("pluggy", "importlib.metadata", "datasets", "huggingface_hub", "filelock", "packaging")
SHOW_MODULES = "import sys, json; print(json.dumps(sorted(sys.modules)))"
PATCHED = (
    "import json, datasets, datasets.builder as b, datasets.utils.file_utils as f, datasets.utils.extract as e;"
    "print(json.dumps([m.FileLock.__module__ for m in (b, f, e)]))"
)


def modules(env: Venv, flags=(), extra=None) -> set[str]:
    return set(json.loads(env.run(SHOW_MODULES, flags=flags, env=extra).stdout))


def test_plain_interpreter_loads_only_the_stdlib_bootstrap(datasets_venv: Venv) -> None:
    loaded = modules(datasets_venv)
    assert {"_sharedfs_bootstrap"} <= loaded  # the .pth really ran
    assert not loaded & set(HEAVY), loaded & set(HEAVY)
    assert {m for m in loaded if m.startswith(("sharedfs", "_sharedfs"))} == {"_sharedfs_bootstrap"}


def test_importing_datasets_loads_the_registry_and_patches_its_locks(datasets_venv: Venv) -> None:
    patched = json.loads(datasets_venv.run(PATCHED).stdout)
    assert patched == ["sharedfs.shims.datasets"] * 3
    status = datasets_venv.status()
    (shim,) = [s for s in status["shims"] if s["name"] == "datasets"]
    assert shim["installed"] == "5.2.0" and shim["supported"] and shim["enabled"]
    assert status["autoload"]["pth_file"].endswith("sharedfs.pth")
    assert status["policy"]["lock"] == {"value": "auto", "source": "default"}


def test_the_public_api_survives_autoload(datasets_venv: Venv) -> None:
    # Autoload imports every kernel module; none may shadow a public name (sharedfs.policy was one).
    code = ("import datasets, sharedfs; p = sharedfs.policy(); "
            "print(p.lock, type(p) is sharedfs.Policy, callable(sharedfs.lock), callable(sharedfs.makedirs))")
    assert datasets_venv.run(code).stdout.split() == ["auto", "True", "True", "True"]


def test_isolated_mode_still_autoloads_and_no_site_mode_breaks_nothing(datasets_venv: Venv) -> None:
    assert json.loads(datasets_venv.run(PATCHED, flags=["-I"]).stdout) == ["sharedfs.shims.datasets"] * 3
    # -S skips .pth files: sharedfs is absent and the interpreter is fine.
    proc = datasets_venv.run(SHOW_MODULES, flags=["-S"])
    assert not any(m.startswith(("sharedfs", "_sharedfs")) for m in json.loads(proc.stdout))
    assert proc.stderr == ""


@pytest.mark.parametrize("value", ["1", "true", "all"])
def test_disable_installs_nothing(datasets_venv: Venv, value: str) -> None:
    code = ("import sys, json, datasets, datasets.builder as b;"
            "print(json.dumps([sorted(m for m in sys.modules if m.startswith(('sharedfs', '_sharedfs'))),"
            " b.FileLock.__module__]))")
    loaded, lock_module = json.loads(datasets_venv.run(code, env={"SHAREDFS_DISABLE": value}).stdout)
    assert loaded == ["_sharedfs_bootstrap"]
    assert lock_module == "datasets.utils._filelock"  # datasets' own class, untouched


def test_disable_by_name_blocks_exactly_that_shim(datasets_venv: Venv) -> None:
    proc = datasets_venv.run(PATCHED, env={"SHAREDFS_DISABLE": "datasets"})
    assert json.loads(proc.stdout) == ["datasets.utils._filelock"] * 3
    status = datasets_venv.status(env={"SHAREDFS_DISABLE": "datasets"})
    assert status["blocked"] == ["datasets"]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SHAREDFS_LOCK": "flok"}, "SHAREDFS_LOCK='flok' is not valid: expected one of auto, flock, posix, soft, lease"),
        ({"SHAREDFS_WAIT_TIMEOUT": "ten"}, "SHAREDFS_WAIT_TIMEOUT='ten' is not valid: expected a positive number"),
        ({"SHAREDFS_CONFIG": "/nonexistent/sharedfs.toml"},
         "SHAREDFS_CONFIG='/nonexistent/sharedfs.toml' is not valid: expected a readable TOML file"),
    ],
)
def test_malformed_settings_fail_loudly_at_first_import_and_in_status(datasets_venv: Venv, env, message) -> None:
    proc = datasets_venv.run("import datasets", env=env, check=False)
    assert proc.returncode == 1
    assert f"sharedfs.errors.ConfigError: {message}" in proc.stderr
    status = datasets_venv.sharedfs("status", env=env)
    assert status.returncode == 2 and message in status.stdout and message in status.stderr
    assert message in json.loads(datasets_venv.sharedfs("status", "--json", env=env).stdout)["config_error"]


def test_invalid_toml_names_file_and_key(datasets_venv: Venv, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("lock = [\n")
    proc = datasets_venv.sharedfs("status", env={"SHAREDFS_CONFIG": str(bad)})
    assert proc.returncode == 2 and f"SHAREDFS_CONFIG='{bad}' is not valid: expected valid TOML" in proc.stdout
    unknown = tmp_path / "unknown.toml"
    unknown.write_text('lok = "soft"\n')
    proc = datasets_venv.sharedfs("status", env={"SHAREDFS_CONFIG": str(unknown)})
    assert f"{unknown}: lok='soft' is not valid: expected a known key" in proc.stdout
    good = tmp_path / "good.toml"
    good.write_text('[sharedfs]\nlock = "soft"\nwait_timeout = 12\n')
    policy = datasets_venv.status(env={"SHAREDFS_CONFIG": str(good), "SHAREDFS_WAIT_TIMEOUT": "7"})["policy"]
    assert policy["lock"] == {"value": "soft", "source": f"{good}: lock"}
    assert policy["wait_timeout"] == {"value": 7.0, "source": "SHAREDFS_WAIT_TIMEOUT"}  # env beats file


def _plugin_dist(tmp_path: Path, name: str, body: str) -> Path:
    src = tmp_path / name
    (src / name).mkdir(parents=True)
    (src / name / "__init__.py").write_text(textwrap.dedent(body))
    (src / "pyproject.toml").write_text(textwrap.dedent(f"""
        [build-system]
        requires = ["hatchling"]
        build-backend = "hatchling.build"
        [project]
        name = "{name}"
        version = "1.2.3"
        [project.entry-points.sharedfs]
        {name} = "{name}"
    """))
    return src


def test_third_party_plugins_are_discovered_and_a_broken_one_is_not_fatal(
    datasets_venv: Venv, tmp_path: Path
) -> None:
    good = _plugin_dist(tmp_path, "sitepolicy", """
        from sharedfs.machinery.hookspecs import hookimpl
        from sharedfs.model.policy import Layer

        @hookimpl
        def sharedfs_settings_layers(environ):
            return [Layer("site policy", 150, {"lock": "soft"}, {"lock": "sitepolicy plugin"})]
    """)
    broken = _plugin_dist(tmp_path, "brokenplugin", "raise RuntimeError('boom at import')\n")
    datasets_venv.pip("install", str(good), str(broken))
    try:
        status = datasets_venv.status()
        plugins = {p["name"]: p for p in status["external_plugins"]}
        assert plugins["sitepolicy"]["error"] is None and plugins["sitepolicy"]["version"] == "1.2.3"
        assert plugins["brokenplugin"]["error"] == "RuntimeError: boom at import"
        assert status["policy"]["lock"] == {"value": "soft", "source": "sitepolicy plugin"}
        proc = datasets_venv.run(PATCHED)  # the user's import still works
        assert "plugin 'brokenplugin' from brokenplugin 1.2.3 failed to load" in proc.stderr
        blocked = datasets_venv.status(env={"SHAREDFS_DISABLE": "sitepolicy"})
        assert blocked["policy"]["lock"]["value"] == "auto"
    finally:
        datasets_venv.pip("uninstall", "-y", "sitepolicy", "brokenplugin")


@pytest.mark.parametrize("editable", [False, True], ids=["wheel", "editable"])
def test_install_modes_behave_alike_and_uninstall_leaves_nothing(
    tmp_path: Path, sharedfs_wheel: Path, editable: bool
) -> None:
    from helpers import ROOT

    env = make_venv(tmp_path / "venv")
    env.pip("install", *(["-e", str(ROOT)] if editable else [str(sharedfs_wheel)]))
    files = {p.name for p in env.site_packages.iterdir()}
    assert {"sharedfs.pth", "sharedfs.start"} <= files
    if editable:
        assert not (env.site_packages / "sharedfs").exists()  # no stale copies of plugins/ or shims/
    loaded = modules(env)
    assert "_sharedfs_bootstrap" in loaded and not loaded & set(HEAVY)
    env.run("import sharedfs.plugins.settings, sharedfs.shims.datasets")
    assert env.status()["autoload"]["active_in_this_interpreter"] is True
    env.pip("uninstall", "-y", "sharedfs")
    assert not {"sharedfs.pth", "sharedfs.start"} & {p.name for p in env.site_packages.iterdir()}
    assert subprocess.run([env.python, "-c", "pass"], capture_output=True, text=True).stderr == ""


def test_disable_and_enable_at_run_time_restore_and_reapply(datasets_venv: Venv) -> None:
    code = textwrap.dedent("""
        import json, sys, datasets, datasets.builder as b, sharedfs
        seen = [b.FileLock.__module__]
        sharedfs.disable()
        seen.append(b.FileLock.__module__)
        seen.append(any(type(f).__name__ == "_TargetFinder" for f in sys.meta_path))
        sharedfs.enable()
        seen.append(b.FileLock.__module__)
        print(json.dumps(seen))
    """)
    assert json.loads(datasets_venv.run(code).stdout) == [
        "sharedfs.shims.datasets", "datasets.utils._filelock", False, "sharedfs.shims.datasets"]

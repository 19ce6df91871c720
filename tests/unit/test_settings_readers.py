"""Each setting is read from the environment in one place: ``sharedfs.model.settings.from_environ`` (issue 51).

Four readers of ``SHAREDFS_DISABLE`` had parsed it three ways, and a setting given in the TOML file or to
``configure()`` did not block a plugin as the variable did.  This scan finds any other
``os.environ.get`` / ``os.environ[...]`` / ``os.getenv`` of a setting's variable in the kernel, the plugins
or the shims.  The bootstrap (``_sharedfs_bootstrap.py``, stdlib only at ``.pth`` time) reads
``SHAREDFS_DISABLE`` with the same parser and is outside the scan.
"""

from __future__ import annotations

import ast
from pathlib import Path

from sharedfs.model import envvars
from sharedfs.model.settings import SETTINGS

ROOT = Path(__file__).resolve().parents[2]
VARIABLES = {setting.env for setting in SETTINGS}
#: Names of envvars' constants, and the bootstrap's, that hold a setting's variable.
CONSTANTS = {name for name, value in vars(envvars).items() if isinstance(value, str) and value in VARIABLES} | {"DISABLE"}
#: (file, variable constant) read directly on purpose.
ALLOWED = {
    ("sharedfs/model/settings.py", "*"),
    # SHAREDFS_STRICT matters most when the policy itself cannot be built, so it is read without it.
    ("sharedfs/machinery/runtime.py", "STRICT"),
}


def _variable(node: ast.expr) -> str | None:
    if isinstance(node, ast.Constant) and node.value in VARIABLES:
        return str(node.value)
    if isinstance(node, ast.Attribute) and node.attr in CONSTANTS:
        return node.attr
    if isinstance(node, ast.Name) and node.id in CONSTANTS:
        return node.id
    return None


def _is_environ(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id == "environ") or \
        (isinstance(node, ast.Attribute) and node.attr == "environ")


def readers(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        variable = None
        if isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Attribute):
            if (node.func.attr == "get" and _is_environ(node.func.value)) or node.func.attr == "getenv":
                variable = _variable(node.args[0])
        elif isinstance(node, ast.Subscript) and _is_environ(node.value) and isinstance(node.ctx, ast.Load):
            variable = _variable(node.slice)
        if variable:
            found.append((node.lineno, variable))
    return found


def test_the_scan_finds_a_reader() -> None:
    code = "import os\nfrom sharedfs.model import envvars\nraw = os.environ.get(envvars.DISABLE, '')\n" \
           "x = os.environ['SHAREDFS_LOCK']\ny = os.getenv(DISABLE)\n"
    assert readers(ast.parse(code)) == [(3, "DISABLE"), (4, "SHAREDFS_LOCK"), (5, "DISABLE")]


def test_no_setting_is_read_from_the_environment_outside_the_settings_model() -> None:
    found = []
    for top in ("sharedfs", "plugins", "shims"):
        for path in sorted((ROOT / top).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            if name.startswith("sharedfs/demo/") or (name, "*") in ALLOWED:
                continue  # the demo sets the variables of the programs it starts
            found += [f"{name}:{line}: {variable}" for line, variable in readers(ast.parse(path.read_text()))
                      if (name, variable) not in ALLOWED]
    assert found == [], "read these through sharedfs.model.settings.from_environ"

"""docs/architecture.md matches the code: what it names exists, every folder's modules are named, and
its table of the ways a shim is applied is the code's tables."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import _sharedfs_bootstrap
import sharedfs

KERNEL = Path(sharedfs.__file__).parent
ROOT = KERNEL.parent
DOC = ROOT / "docs" / "architecture.md"
#: The first part of a name that is ours (anything else in backticks is a framework's, a variable, a value).
OURS = {"sharedfs", "_sharedfs_bootstrap", "plugins", "shims", "tests", "docs", "scripts", "benchmarks",
        "commands", "startup", "shardcache", "modulecache", "locks", "cluster", "machinery", "model", "fs", "demo"}


def text() -> str:
    return DOC.read_text()


def _exists(token: str) -> bool:
    """A path (relative to the checkout or to sharedfs/) or a dotted module or attribute of ours."""
    token = token.rstrip("/")
    if "/" in token or token.endswith((".py", ".toml", ".md")):
        return any((base / token).exists() for base in (ROOT, KERNEL))
    parts = token.split(".")
    if parts[0] not in ("sharedfs", "_sharedfs_bootstrap"):
        parts = ["sharedfs", *parts]
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def named_of_ours(doc: str) -> set[str]:
    tokens = set()
    for token in re.findall(r"`([A-Za-z_][\w./*]*)`", doc):
        first = re.split(r"[./]", token)[0]
        if first in OURS and "*" not in token and token not in OURS:
            tokens.add(token)
    return tokens


def missing(doc: str) -> list[str]:
    return sorted(token for token in named_of_ours(doc) if not _exists(token))


def folder_rows(doc: str) -> dict[str, str]:
    """The folder table: ``folder/`` -> the row's text."""
    rows = {}
    for line in doc.splitlines():
        match = re.match(r"\| `(\w+)/`", line)
        if match:
            rows[match.group(1)] = line
    return rows


def unnamed(doc: str) -> list[str]:
    """Every folder of the kernel without a row, and every module its row does not name."""
    rows = folder_rows(doc)
    problems = []
    for folder in sorted(p for p in KERNEL.iterdir() if (p / "__init__.py").is_file()):
        if folder.name in ("plugins", "shims", "demo"):  # beside the layers; the text after the table names them
            continue
        row = rows.get(folder.name)
        if row is None:
            problems.append(f"{folder.name}/: no row")
            continue
        for module in sorted(folder.glob("*.py")):
            if module.stem != "__init__" and f"`{module.stem}`" not in row:
                problems.append(f"{folder.name}/{module.name}: not named in its row")
    return problems


def test_every_name_of_ours_the_architecture_names_exists() -> None:
    doc = text()
    assert {"machinery/runtime.py", "_sharedfs_bootstrap.SHIMS", "sharedfs.commands.probeworker"} <= named_of_ours(doc)
    assert missing(doc) == []


def test_every_folder_and_module_of_the_kernel_is_named() -> None:
    assert unnamed(text()) == []


def test_a_stale_name_and_an_unnamed_module_are_found() -> None:
    doc = text().replace("`machinery/runtime.py`", "`machinery/state.py`", 1)
    assert missing(doc) == ["machinery/state.py"]
    rows = folder_rows(text())
    doc = text().replace(rows["fs"], rows["fs"].replace("`umask`", "umask"), 1)
    assert unnamed(doc) == ["fs/umask.py: not named in its row"]


def ways_table(doc: str) -> dict[str, set[str]]:
    """The table of ways a shim is applied: way -> the shims its last column names."""
    section = doc[doc.index("### Applying a shim"):]
    ways = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0] not in ("way",) and not cells[0].startswith("-"):
            ways[cells[0].split(" (")[0]] = set(re.findall(r"`([\w.*]+)`", re.sub(r"\(.*?\)", "", cells[4])))
        elif ways and not line.startswith("|"):
            break
    return ways


def test_the_ways_a_shim_is_applied_are_the_code_tables() -> None:
    from sharedfs.startup.activation import COMPANIONS
    from sharedfs.startup.onimport import FOLLOWERS, PENDING, STAND_INS

    ways = ways_table(text())
    assert set(ways) == {"at once", "stand-in", "pending guard", "follower", "companion"}
    rows = _sharedfs_bootstrap.SHIMS
    assert ways["stand-in"] == {name for name, row in rows.items() if row[1] == _sharedfs_bootstrap.STAND_IN}
    assert ways["stand-in"] == {shim for shim, *_attrs in STAND_INS.values()}
    assert ways["pending guard"] == set(PENDING) == {name for name, row in rows.items() if row[1] == "pending"}
    assert ways["follower"] == set(FOLLOWERS) == {name for name, row in rows.items() if row[1] == "follower"}
    assert ways["companion"] == set(COMPANIONS) == {name for name, row in rows.items() if "companion" in row[2:]}
    at_once = {name for name, row in rows.items() if row[1] == _sharedfs_bootstrap.AT_ONCE}

    def covered(name: str) -> bool:
        return any(name == entry or (entry.endswith("*") and name.startswith(entry[:-1])) for entry in ways["at once"])

    assert sorted(name for name in at_once if not covered(name)) == []
    assert sorted(e for e in ways["at once"] if not any(covered(n) and (n == e or e.endswith("*")) for n in at_once)) == []

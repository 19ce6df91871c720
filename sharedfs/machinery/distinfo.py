"""Installed distributions, read from their metadata directories: no importlib.metadata at start-up.

Importing importlib.metadata costs a third of activation; what this cannot answer plainly is left to it.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Optional

__all__ = ["declares_group", "in_range", "version"]

# Patterns are strings, compiled by ``re`` on first use and kept in its cache: compiling at
# import cost each framework's first import ~1 M instructions a pattern, used or not.
#: A plain release: digits and dots, optionally a local label (``2.13.0+cpu``).
_PLAIN = r"(?i)^v?(\d+(?:\.\d+)*)(?:\+[a-z0-9.]+)?$"
_BOUND = r"^\s*(>=|<=|==|!=|<|>)\s*(\d+(?:\.\d+)*)\s*$"
_SEPARATORS = str.maketrans("_.", "--")


def _normalize(name: str) -> str:
    """PEP 503: runs of ``-``, ``_`` and ``.`` become one ``-``, lower case (without a regex: 100 names a scan)."""
    name = name.translate(_SEPARATORS).lower()
    while "--" in name:
        name = name.replace("--", "-")
    return name


class _Scan:
    """One pass over sys.path: name -> version, and the entry-point files to search."""

    def __init__(self) -> None:
        self.versions: dict[str, Optional[str]] = {}
        self.entry_point_files: list[str] = []
        self.incomplete = False  # something only importlib.metadata can read (a zip, a versionless egg-info)
        for entry in sys.path:
            try:
                names = os.listdir(entry or ".")
            except OSError:
                if os.path.isfile(entry):  # a zip archive (or an egg) on sys.path
                    self.incomplete = True
                continue
            for name in names:
                stem, dot, suffix = name.rpartition(".")
                if suffix not in ("dist-info", "egg-info") or not dot:
                    continue
                dist, _, ver = stem.partition("-")
                key = _normalize(dist)
                if suffix == "egg-info":
                    ver = ver.split("-py", 1)[0]
                if not ver:
                    self.incomplete = True
                self.versions.setdefault(key, ver or None)
                self.entry_point_files.append(os.path.join(entry or ".", name, "entry_points.txt"))


_scan: Optional[_Scan] = None


def _get() -> _Scan:
    global _scan
    if _scan is None:
        _scan = _Scan()
    return _scan


def forget() -> None:
    """Scan again on next use (after installing or removing distributions, and in tests)."""
    global _scan
    _scan = None


def version(distribution: str) -> Optional[str]:
    """The installed version of ``distribution`` (``None`` when not installed), as importlib.metadata says."""
    scan = _get()
    found = scan.versions.get(_normalize(distribution))
    if found is not None:
        return found
    if _normalize(distribution) not in scan.versions and not scan.incomplete:
        return None
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as metadata_version

    try:
        return metadata_version(distribution)
    except PackageNotFoundError:
        return None


def declares_group(group: str) -> bool:
    """Whether any installed distribution may declare entry points in ``group`` (True when unsure)."""
    scan = _get()
    if scan.incomplete:
        return True
    header = f"[{group}]".encode()
    for path in scan.entry_point_files:
        try:
            with open(path, "rb") as fh:
                text = fh.read()
        except OSError:
            continue
        if header in text:
            return True
    return False


def _release(text: str) -> tuple[int, ...]:
    parts = [int(p) for p in text.split(".")]
    while len(parts) > 1 and parts[-1] == 0:  # 2.0 == 2
        parts.pop()
    return tuple(parts)


def in_range(installed: str, spec: str) -> Optional[bool]:
    """``installed`` within ``spec`` (``">=2.14,<6"``), or ``None`` when only packaging can tell.

    Plain releases and bounds only, where PEP 440 ordering is the ordering of the release
    numbers; a local label (``+cpu``) is ignored, as PEP 440 says for these operators.
    """
    plain = re.match(_PLAIN, installed.strip())
    if plain is None:
        return None  # pre-, post- and dev-releases: packaging knows their ordering
    have = _release(plain.group(1))
    for clause in spec.split(","):
        bound = re.match(_BOUND, clause)
        if bound is None:
            return None
        op, want = bound.group(1), _release(bound.group(2))
        ok = {">=": have >= want, "<=": have <= want, "<": have < want, ">": have > want, "==": have == want,
              "!=": have != want}[op]
        if not ok:
            return False
    return True

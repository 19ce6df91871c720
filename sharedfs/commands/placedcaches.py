"""The placed-cache table in ``sharedfs status`` and ``sharedfs env`` (the table: :mod:`sharedfs.model.caches`)."""

from __future__ import annotations

import os
from typing import Any

from sharedfs.model.caches import default_path
from sharedfs.model.policy import Policy
from sharedfs.startup import placedcaches


def status_rows(policy: Policy) -> list[dict[str, Any]]:
    """Every row of the table with where its cache goes in programs of this environment, and why."""
    out = []
    for row, placed, problem in placedcaches.rows(policy):
        user_value = os.environ.get(row.variable) or None
        path = placed.path if placed is not None and placed.path else (user_value or default_path(row))
        if problem is not None:
            placement, reason = "not placed", f"REFUSED: {problem}"
        elif placed is not None and placed.path:
            placement, reason = ("node-local" if policy.cache == "node-local" else "per node"), placed.reason
        else:
            placement, reason = ("user's" if user_value else "default"), placed.reason if placed else ""
        out.append({"name": row.name, "variable": row.variable, "path": path, "placement": placement,
                    "reason": reason, "default": row.default, "shareable": row.shareable, "why": row.why,
                    "read": row.read})
    return out


def status_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The rows as ``sharedfs status`` prints them."""
    lines = ["placed caches (libraries' own cache variables; a variable you set is never touched):"]
    for row in rows:
        lines.append(f"  {row['name']:<16} {row['variable']}={row['path']} [{row['placement']}]")
        lines.append(f"  {'':<16} {row['reason']}")
    return lines

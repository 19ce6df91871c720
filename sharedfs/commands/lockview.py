"""``sharedfs locks``'s text: one block per lock, then what the counts mean and what to run."""

from __future__ import annotations

import time

from sharedfs.locks.rows import DEAD, FREE, HELD, MARKER, UNKNOWN, Row

__all__ = ["holder_text", "text_lines"]


def _age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def holder_text(row: Row, now: float) -> str:
    holder = row.holder()
    if holder is None:
        owner = f"file of {row.user}" if row.user else "no record"
        age = f", last changed {_age(now - row.changed)} ago" if row.changed is not None else ""
        return owner + age
    parts = [holder["user"] or "?", f"pid {holder['pid']}", f"node {holder['node']}"]
    if holder.get("job"):
        parts.append(f"Slurm job {holder['job']}" + (f".{holder['step']}" if holder.get("step") else ""))
    if holder.get("since"):
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder["since"]))
        parts.append(f"since {when} ({_age(now - holder['since'])})")
    return ", ".join(parts)


def text_lines(rows: list[Row], *, cleared: bool, single: bool) -> list[str]:
    now = time.time()
    lines = []
    free = 0
    for row in rows:
        if row.state == FREE and not single:
            free += 1
            continue
        state = row.state.upper() + (" (removed)" if row.cleared else "")
        kind = row.kind if row.record is None or row.kind != MARKER else f"{row.record.kind} marker"
        lines.append(f"{state:<16} {kind:<14} {row.lock}")
        lines.append(f"{'':<16} holder   : {holder_text(row, now)}")
        lines.append(f"{'':<16} evidence : {row.evidence}")
        if row.file != row.lock:
            lines.append(f"{'':<16} file     : {row.file}")
    counts = {state: sum(1 for r in rows if r.state == state) for state in (HELD, DEAD, UNKNOWN)}
    summary = (f"{counts[HELD]} held, {counts[DEAD]} dead, {counts[UNKNOWN]} unknown"
               + (f"; {free} free lock files not shown" if free else ""))
    lines.append(summary if lines else f"no lock is held here ({summary})")
    removed = sum(1 for r in rows if r.cleared)
    if cleared:
        lines.append(f"removed {removed} dead marker(s) through the lock's own breaking protocol")
    elif counts[DEAD]:
        lines.append("dead holders' markers can be removed safely with: sharedfs locks --clear-dead PATH "
                     "(live holders, and holders nobody here can vouch for, keep their locks)")
    if counts[UNKNOWN]:
        lines.append("unknown is never cleared: run this command where the holder ran, or where the scheduler "
                     "can be asked (see each evidence line)")
    return lines

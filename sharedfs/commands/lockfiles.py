"""``sharedfs locks PATH...``: every lock under a tree, who holds it, which holders are gone; clearing those.

How it reads each file and why it clears only by descriptor: docs/architecture.md, "Lock files and their readers".
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Callable

from sharedfs.commands.lockview import text_lines
from sharedfs.commands.lockwalk import MAX_DEPTH, Descent, LocksError, Place, Walk, find
from sharedfs.fs.directory import Changed
from sharedfs.locks import _marker
from sharedfs.locks.markerfiles import ClearRefused, clear_in
from sharedfs.locks.rows import DEAD, FREE, HELD, MARKER, TOO_DEEP, UNKNOWN, Row, judge
from sharedfs.model.records import user_name

log = logging.getLogger("sharedfs")

#: Exit status: nothing held (free or dead only), something held or undecidable, an error.
EXIT_FREE, EXIT_HELD, EXIT_ERROR = 0, 1, 2


def clear(row: Row, descent: Descent | None = None) -> bool:
    """Remove a dead row's file by its lock's own protocol; True when this call removed it.

    Everything happens in the row's directory as the walk reached it, opened again from the top
    through ``descent`` (which keeps what the previous row's clear opened, so each directory is
    opened once per clear, not once per level): a directory that changed since is not entered
    (:class:`Changed`, raised), so nothing outside the tree the operator named is ever removed,
    or created.
    """
    seen = row.seen
    if row.state != DEAD or seen is None or row.place is None:
        return False
    if descent is None:
        with Descent() as own:
            return clear_in(own.enter(row.place), row, seen)
    return clear_in(descent.enter(row.place), row, seen)


def _look_again(row: Row, descent: Descent) -> None:
    """A dead marker this run did not remove: what is there now (a waiter may have broken it and taken the lock)."""
    if row.place is None:
        return
    try:
        now = _marker.read_in(descent.enter(row.place), row.name or os.path.basename(row.file))
    except OSError:
        return
    if now is None:
        row.state, row.evidence = FREE, row.evidence + "; gone before this run removed it (released or broken)"
        return
    if now.record is None or now.identity == (row.seen.identity if row.seen else None):
        row.evidence += "; not removed this time (another process was breaking it): run again"
        return
    state, evidence = judge(now.record)
    row.record, row.state, row.seen = now.record, state, None
    row.evidence = f"broken and taken again while this run looked: now {evidence}"


# -- the command ------------------------------------------------------------------------------------


def selected(row: Row, older_than: float | None, user: str | None, now: float) -> bool:
    if user is not None:
        uid = row.record.uid if row.record is not None and row.record.uid is not None else row.owner
        if row.native_holder is not None:
            uid = row.native_holder.get("uid")
        if uid is None or user not in (user_name(uid), str(uid)):
            return False
    if older_than is not None:
        since = row.since
        if since is None or now - since < older_than:
            return False
    return True


def run(paths: list[str], *, clear_dead: bool = False, older_than: float | None = None, user: str | None = None,
        walk: Walk | None = None, say: Callable[[str], None] | None = None) -> tuple[list[Row], list[str], int]:
    """Rows, errors and the exit status of ``sharedfs locks``."""
    walk = walk or Walk()
    try:
        return _run(paths, clear_dead, older_than, user, walk)
    finally:
        walk.descent.close()
        for top in walk.tops:
            top.close()
        walk.tops.clear()


def _run(paths: list[str], clear_dead: bool, older_than: float | None, user: str | None,
         walk: Walk) -> tuple[list[Row], list[str], int]:
    now = time.time()
    rows: list[Row] = []
    errors: list[str] = []
    try:
        for _, found in find(paths, walk):
            # A subtree not walked is said whatever the selection: what is below it may be selected.
            rows.extend(row for row in found if row.kind == TOO_DEEP or selected(row, older_than, user, now))
    finally:
        walk.show(done=True)
    errors.extend(walk.errors)
    if clear_dead:
        with Descent(walk.call) as descent:
            _clear_dead(rows, walk, errors, descent)
    status = EXIT_HELD if any(r.state in (HELD, UNKNOWN) for r in rows) or walk.skipped else EXIT_FREE
    if errors:
        status = EXIT_ERROR
    return rows, errors, status


def _clear_dead(rows: list[Row], walk: Walk, errors: list[str], descent: Descent) -> None:
    # Markers first: an own-name file that is a dead marker's second name goes with its marker.  Each kind in the
    # walk's order, so the descent reopens only the levels one row's directory does not share with the last.
    for row in sorted((r for r in rows if r.state == DEAD and r.seen is not None),
                      key=lambda r: r.kind != MARKER):
        try:
            row.cleared = clear(row, descent)
        except ClearRefused as refused:
            row.cleared = False
            errors.append(f"cannot remove {row.file}: {refused}")
            continue
        except Changed as exc:
            row.cleared = False
            walk.skipped.append(f"not removed {row.file}: {exc.filename} {exc.strerror} since the walk "
                                "listed it (nothing outside the tree is touched)")
            continue
        except OSError as exc:
            row.cleared = False
            errors.append(f"cannot remove {row.file}: {exc.strerror or exc}")
            continue
        if row.cleared:
            log.info("removed %s (%s)", row.file, row.evidence)
        elif row.kind == MARKER:
            _look_again(row, descent)


def main(paths: list[str], *, as_json: bool, clear_dead: bool, older_than: float | None,
         user: str | None) -> int:
    import json

    if older_than is not None and not older_than >= 0:
        print(f"sharedfs locks: --older-than must be a number of seconds >= 0, not {older_than}", file=sys.stderr)
        return EXIT_ERROR
    if user is not None and not _known_user(user):
        print(f"sharedfs locks: --user {user}: no such user (give a user name or a numeric uid)", file=sys.stderr)
        return EXIT_ERROR
    walk = Walk()
    try:
        rows, errors, status = run(paths, clear_dead=clear_dead, older_than=older_than, user=user, walk=walk)
    except LocksError as exc:
        print(f"sharedfs locks: {exc}", file=sys.stderr)
        return EXIT_ERROR
    if as_json:
        print(json.dumps([row.as_json() for row in rows], indent=2))
    else:
        single = all(not os.path.isdir(p) for p in paths)
        # A subtree not walked is not a lock: its line goes to stderr with the skipped ones.
        listed = [row for row in rows if row.kind != TOO_DEEP]
        print("\n".join(text_lines(listed, cleared=clear_dead, single=single)))
    for line in walk.skipped:
        print(f"sharedfs locks: {line}", file=sys.stderr)
    for error in errors:
        print(f"sharedfs locks: {error}", file=sys.stderr)
    return status


def _known_user(user: str) -> bool:
    """A user name this system knows, or a numeric uid (a departed user's files keep theirs)."""
    if user.isdigit():
        return True
    import pwd

    try:
        pwd.getpwnam(user)
    except KeyError:
        return False
    return True


__all__ = ["EXIT_ERROR", "EXIT_FREE", "EXIT_HELD", "MAX_DEPTH", "ClearRefused", "Descent", "LocksError", "Place", "Row",
           "Walk", "clear", "find", "judge", "main", "run"]

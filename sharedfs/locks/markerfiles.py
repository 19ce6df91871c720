"""Markers, break turns and own names read back and cleared by ``sharedfs locks``, beside their writer (_marker)."""

from __future__ import annotations

import os
import re
import time

from sharedfs.fs.directory import Directory, identity, owner_may_remove
from sharedfs.locks import _marker
from sharedfs.locks.names import TORCH_BATON_NAME, TORCH_GUARD_SUFFIX
from sharedfs.locks.rows import (
    BREAK_TURN,
    DEAD,
    HELD,
    MARKER,
    OWN_NAME,
    UNKNOWN,
    Looker,
    Row,
    judge,
    not_a_record,
    read,
)
from sharedfs.model.records import HolderRecord, user_name

__all__ = ["OWN_NAME_PATTERN", "ClearRefused", "break_turn_row", "clear_in", "marker_row", "own_name_row"]

#: ``<lock>.held.<crc32 of the record, 8 hex>``: a taker's record before it is linked to the marker.
OWN_NAME_PATTERN = re.compile(r"(.+" + re.escape(_marker.SUFFIX) + r")\.([0-9a-f]{8})")


def marker_row(where: Directory, name: str, walk: Looker) -> Row | None:
    path = where.join(name)
    lock = path[:-len(_marker.SUFFIX)]
    seen = read(where, name, walk)
    if seen is None:
        return None  # released while we looked
    if not seen.readable:
        what, owner, changed = not_a_record(where, name, walk)
        return Row(lock, MARKER, UNKNOWN, f"{what} sits at the marker, which sharedfs never writes: the lock counts "
                   "as held for every waiter. If nobody uses this lock, ask its owner to remove it", path,
                   owner=owner, changed=changed)
    if seen.record is None:
        empty = not seen.data
        why = ("an empty marker: its taker was killed between creating and writing it (or is writing it now); "
               f"waiters break it once it stays empty for {_marker.EMPTY_GRACE:g} s") if empty else (
            "the marker holds no record sharedfs can read (garbage, or another program's): the lock counts as "
            "held for every waiter. If nobody uses this lock, ask its owner to remove it")
        return Row(lock, MARKER, UNKNOWN, why, path, owner=seen.owner)
    record = seen.record
    state, evidence = judge(record)
    if os.path.basename(lock) == TORCH_BATON_NAME + TORCH_GUARD_SUFFIX:
        evidence = f"torch extension build lock of {os.path.dirname(lock)}: {evidence}"
    if record.kind == "lease" and state != DEAD:
        evidence += (f"; a lease: waiters take it over once it stays unrenewed for "
                     f"{record.lease_seconds or 0:g} s")
    elif record.kind in ("flock", "posix") and state != DEAD:
        evidence += f"; a {record.kind} lock's waiter that takes {record.kind} on {os.path.basename(lock)} breaks it"
    return Row(lock, MARKER, state, evidence, path, record=record, owner=seen.owner,
               seen=seen if state == DEAD else None)


def break_turn_row(where: Directory, name: str, walk: Looker) -> Row | None:
    path = where.join(name)
    lock = path[:-len(_marker.SUFFIX + _marker.BREAK_SUFFIX)]
    seen = read(where, name, walk)
    if seen is None:
        return None
    if seen.record is None:
        what = "an empty or unreadable file" if seen.readable else not_a_record(where, name, walk)[0]
        return Row(lock, BREAK_TURN, UNKNOWN, f"the break turn is {what}; breakers clear it after "
                   f"{_marker.BREAK_GRACE:g} s", path, owner=seen.owner)
    state, evidence = judge(seen.record)
    return Row(lock, BREAK_TURN, state, f"a process breaking a dead holder's marker: {evidence}", path,
               record=seen.record, owner=seen.owner, seen=seen if state == DEAD else None)


def own_name_row(where: Directory, name: str, marker: str, walk: Looker) -> Row | None:
    """``<lock>.held.<crc>``: a taker's record under its own name, before (or while) it is linked to the marker."""
    path = where.join(name)
    lock = where.join(marker[:-len(_marker.SUFFIX)])
    seen = read(where, name, walk)
    if seen is None:
        return None
    if seen.record is None or _marker.own_name(marker, seen.data) != name:
        return Row(lock, OWN_NAME, UNKNOWN, "named like a taker's own record file, but its content is not the "
                   "record its name says: not sharedfs's; the lock is unaffected by it", path, owner=seen.owner)
    state, evidence = judge(seen.record)
    if state == DEAD:
        evidence = f"left by a taker killed while it created the marker: {evidence}"
    elif state == HELD:
        evidence = f"a taker creating the marker right now: {evidence}"
    return Row(lock, OWN_NAME, state, evidence, path, record=seen.record, owner=seen.owner,
               seen=seen if state == DEAD else None)


class ClearRefused(Exception):
    """This row's file stays: the directory does not let this user remove it, or (as root) its owner could not."""


def clear_in(where: Directory, row: Row, seen: _marker.Seen) -> bool:
    from sharedfs.machinery import runtime

    policy = runtime.policy()
    registry = runtime.registry()
    try:
        st = where.lstat(row.name)
    except FileNotFoundError:
        return False
    if (st.st_dev, st.st_ino, st.st_ctime_ns) != seen.identity:
        return False  # not the file that was judged dead
    if os.geteuid() == 0 and not owner_may_remove(where.stat(), st):
        # Root may remove anything anywhere; a clear acts for the dead holder, so it removes only what that
        # holder could have removed itself (a file planted where its owner may not write is not its lock).
        raise ClearRefused(f"{user_name(st.st_uid)} could not remove it from {where.path} (no write permission "
                           "there), so it is no lock of theirs to clear: root leaves it")

    def dead(other: HolderRecord) -> bool:
        return registry.holder_alive(other, policy, None) is False

    if row.kind == MARKER:
        breaker = HolderRecord.mine(policy.node_id, "break")
        try:
            for _ in range(3):  # another breaker's turn (a waiter breaking the same dead holder) ends in ms
                if _marker.break_in(where, row.name, seen, breaker, dead):
                    return True
                now = _marker.read_in(where, row.name)
                if now is None or now.data != seen.data or now.identity != seen.identity:
                    return False  # released, or broken and taken by someone else meanwhile: theirs now
                time.sleep(0.05)
        except _marker.NotAllowed:
            owner = user_name(row.owner) if row.owner is not None else "its owner"
            raise ClearRefused(f"it belongs to {owner} and its directory does not let you remove another user's "
                               "file (sticky or read-only); ask them or an administrator to run: "
                               f"sharedfs locks --clear-dead {row.lock}") from None
        return False
    if row.kind in (OWN_NAME, BREAK_TURN):
        # No taker ever writes these names again (an own name is derived from the dead taker's record,
        # a break turn is created O_EXCL): removing the file still exactly as read is all the protocol asks.
        if row.kind == OWN_NAME and st.st_nlink > 1:
            return False  # still the marker's second name: the marker's break removes both
        try:
            return where.unlink_if_same(row.name, identity(st))
        except OSError:
            return False
    return False

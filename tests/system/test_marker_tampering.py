"""Another process tampering with a taker's own record file (``<lock>.held.<crc>``) between its creation and its link.

A marker is made by writing the holder's record under the taker's own name and hard-linking that to
``<lock>.held`` (sharedfs.locks._marker.create).  Anyone who may write the lock directory (a shared
project directory) can, in between, remove that own name or put a directory there.  link(2) then
answers ENOENT or EPERM; read as the filesystem's answer, the first escaped ``acquire()`` as a
``FileNotFoundError`` and the second as ``IsADirectoryError``, after it had also switched the whole
directory to the weaker no-hard-link protocol for the rest of the process.  Both must be contention:
a wait that ends in a ``LockTimeout`` naming the file, and the next lock there made by link(2) again.

Real processes on a FUSE filesystem with 20 ms per metadata operation (so the create-to-link window is
tens of milliseconds, as on a loaded metadata server): a taker, and an attacker watching the backing
directory.  First the link as it was before (the attacks succeed), then sharedfs's own.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from helpers import clean_env

#: Watches the backing directory: once a taker's record is written under its own name, removes ``b.lock``'s own-name files, puts a directory at ``a.lock``'s,
#: counts ``c.lock``'s (a marker made by link(2) has one; one made O_EXCL without links has none).
ATTACKER = textwrap.dedent(r"""
    import json, os, re, sys, time
    directory, stop = sys.argv[1:3]
    own = re.compile(r"([abc])\.lock\.held\.[0-9a-f]{8}\Z")
    done, counts = set(), {"a": 0, "b": 0, "c": 0}
    print("watching", flush=True)
    while not os.path.exists(stop):
        for entry in os.scandir(directory):
            found = own.match(entry.name)
            if not found or entry.name in done:
                continue
            try:  # once the record is written: between create_record and link(2)
                if entry.stat(follow_symlinks=False).st_size == 0:
                    continue
            except OSError:
                continue
            done.add(entry.name)
            which = found.group(1)
            counts[which] += 1
            try:
                if which == "b":
                    os.unlink(entry.path)
                elif which == "a":
                    os.rename(entry.path, entry.path + ".moved")
                    os.mkdir(entry.path)
            except OSError:
                pass
        time.sleep(0.001)
    print(json.dumps(counts), flush=True)
""")

#: The own-name link as it was before: any link(2) failure read as the filesystem's answer.
BEFORE = textwrap.dedent("""
    import errno, os
    from sharedfs.fs.recordfile import create_record

    def _create_linked(where, name, data, mode):
        path, directory = where.join(name), where.path
        temp = _marker.own_name(path, data)
        try:
            fd = create_record(temp, data, mode)
        except FileExistsError:
            raise FileExistsError(errno.EEXIST, "another taker's record file has this name", temp) from None
        try:
            try:
                os.link(temp, path, follow_symlinks=False)
                failed = None
            except OSError as exc:
                failed = exc
            try:
                now, ours = os.lstat(path), os.fstat(fd)
                linked = (now.st_dev, now.st_ino) == (ours.st_dev, ours.st_ino)
            except FileNotFoundError:
                linked = False
            if failed is not None and not linked:
                if failed.errno in _marker._NO_LINK_ERRNOS:
                    _marker._NO_LINKS.add(directory)
                    os.unlink(temp)
                    os.close(fd)
                    return None
                raise failed
            if not linked:
                raise FileExistsError(errno.EEXIST, "the lock marker was replaced while it was being made", path)
            os.unlink(temp)
        except BaseException:
            _marker._unlink_if_same(temp, os.fstat(fd))
            os.close(fd)
            raise
        return fd

    _marker._create_linked = _create_linked
""")

#: Takes b.lock and a.lock (2 s each) while attacked, then c.lock; what each acquire() ended in.
TAKER = textwrap.dedent("""
    import json, sys
    import sharedfs
    from sharedfs.locks import _marker
    directory, how = sys.argv[1:3]
    if how == "before":
        exec(sys.argv[3])
    out = {}
    for name, timeout in (("b", 2), ("a", 2), ("c", 30)):
        lock = sharedfs.lock(f"{directory}/{name}.lock", kind="soft", timeout=timeout)
        try:
            lock.acquire()
        except BaseException as exc:
            out[name] = [type(exc).__name__, str(exc)]
        else:
            out[name] = ["acquired", ""]
            lock.release()
    print(json.dumps(out), flush=True)
""")


def _attack(mount, name: str, how: str) -> tuple[dict[str, list[str]], dict[str, int]]:
    (mount.backing / name).mkdir()
    stop = mount.backing.parent / f"stop-{name}"
    attacker = subprocess.Popen([sys.executable, "-c", ATTACKER, str(mount.backing / name), str(stop)],
                                stdout=subprocess.PIPE, text=True, env=clean_env({"SHAREDFS_DISABLE": "1"}))
    try:
        assert attacker.stdout is not None and attacker.stdout.readline().strip() == "watching"
        taker = subprocess.run([sys.executable, "-c", TAKER, str(mount.path / name), how, BEFORE],
                               capture_output=True, text=True, env=clean_env(), timeout=120)
        assert taker.returncode == 0, taker.stderr[-3000:]
    finally:
        stop.touch()
        counts = json.loads(attacker.communicate(timeout=30)[0].strip().splitlines()[-1])
    return json.loads(taker.stdout.strip().splitlines()[-1]), counts


def test_an_own_record_file_removed_or_replaced_by_a_directory_before_its_link_is_contention(
    hostile_mount,
) -> None:
    mount = hostile_mount("plain", latency_ms=20)

    before, seen = _attack(mount, "before", "before")
    print("before:", json.dumps(before), json.dumps(seen))
    assert before["b"][0] == "FileNotFoundError", before
    # Removing the own name, now a directory, fails: EISDIR on a local disk; through FUSE the kernel finds the
    # file it created turned into a directory and answers EIO.  Either escapes acquire().
    assert before["a"][0] in ("IsADirectoryError", "OSError"), before
    # ... and the directory switched to the O_EXCL protocol: c.lock's marker was made without an own name.
    assert before["c"][0] == "acquired" and seen["c"] == 0, (before, seen)

    after, seen = _attack(mount, "after", "sharedfs")
    print("after:", json.dumps(after), json.dumps(seen))
    for name in "ba":
        kind, message = after[name]
        assert kind == "LockTimeout" and "removed or replaced" in message and f"{name}.lock.held." in message, after
        assert seen[name] >= 2, seen  # attacked on every attempt, and tried again each time
    assert after["c"][0] == "acquired" and seen["c"] == 1, (after, seen)  # still made by link(2)
    # Nothing of the taker's stays behind, but the files the attacker moved away (its names now, not the taker's)
    # and FUSE's own .fuse_hidden* stand-ins for files removed while open (gone with the last descriptor).
    left = sorted(p.name for p in (mount.backing / "after").iterdir()
                  if p.is_file() and p.suffix != ".moved" and not p.name.startswith(".fuse_hidden"))
    assert left == [], left

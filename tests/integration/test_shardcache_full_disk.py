"""A full disk must not pin a shard forever: real wids readers on a real, full tmpfs.

When the cache's filesystem is full, creating a reader's in-use marker succeeds
(an empty file needs no data block) and writing its record fails with ENOSPC.
sharedfs before the fix (:data:`shardcache_support.BEFORE`) left that empty
marker behind and read "cannot parse" as "a live reader", with no age limit: the
shard could never be evicted again, even after space was freed, and the reader
got a bare ``[Errno 28]``.  Fixed: the marker is removed at once, the error says
what could not be written and what to do, eviction works as soon as there is
space, and a marker that cannot be read pins its shard for GARBLED_GRACE only.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.skips import skip_or_fail
from helpers import clean_env, require
from helpers.shardcache_support import sharedfs_before

from sharedfs.demo.shardserver import make_shards
from sharedfs.shardcache import GARBLED_GRACE, key

require("wids", "needs wids==0.1.11 (scripts/requirements-test.txt)")
require("torch", "needs torch==2.13.0: wids imports torch.distributed")

pytestmark = pytest.mark.slow
SAMPLES = 5

# A user's reader: every sample of one shard, cached by wids in cache_dir.
READ = textwrap.dedent("""
    import sys, wids
    ds = wids.ShardListDataset([{"url": "file://" + sys.argv[2], "nsamples": NSAMPLES}], cache_dir=sys.argv[1],
                               transformations=[])
    print(len([ds[i] for i in range(len(ds))]), flush=True)
""").replace("NSAMPLES", str(SAMPLES))

# wids' own cleanup (what create_cleanup_background_process runs): keep nothing that is not in use.
CLEAN = textwrap.dedent("""
    import os, sys
    from wids.wids_cleanup import keep_most_recent_files
    keep_most_recent_files(os.path.join(sys.argv[1], "*"), maxsize=1, maxfiles=0)
""")


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs, mounted for this test and unmounted after it."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0755", "tmpfs", str(mnt)], check=False,
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        skip_or_fail(f"cannot mount a tmpfs (needs root): {mounted.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _run(code: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, *args], check=False, env=clean_env(env), capture_output=True,
                          text=True, timeout=300)


def _fill(directory: Path) -> Path:
    """Write a file until the filesystem is full, to the last byte."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for chunk in (1 << 16, 4096, 1):
            try:
                while True:
                    os.write(fd, b"\0" * chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)
    return filler


def _scenario(fs: Path, label: str, source: Path, env: dict[str, str], markers: str) -> dict:
    """Cache a shard, fill the disk, read it again, free the space, clean up.  What happened at each step."""
    cache = fs / label / "cache"
    cache.mkdir(parents=True)
    first = _run(READ, str(cache), str(source), env=env)
    assert first.returncode == 0 and first.stdout.strip() == str(SAMPLES), first.stderr
    filler = _fill(fs)
    full = _run(READ, str(cache), str(source), env=env)
    # Empty markers: what the ENOSPC left (the first reader's complete marker names a dead process).
    left = [m for m in sorted(Path(markers.format(cache=cache)).glob("*")) if m.stat().st_size == 0]
    filler.unlink()
    cleaned = _run(CLEAN, str(cache), env=env)
    assert cleaned.returncode == 0, cleaned.stderr
    pinned = (cache / source.name).exists()
    for marker in left:  # a day old: "forever" for any reader of a 2 MiB shard
        if marker.exists():
            os.utime(marker, (time.time() - 86400, time.time() - 86400))
    if left:
        _run(CLEAN, str(cache), env=env)
    return {"full": full, "markers": left, "pinned": pinned, "pinned_a_day_later": (cache / source.name).exists()}


def test_disk_full_while_opening_a_shard_no_longer_pins_it_forever(small_fs: Path, tmp_path: Path) -> None:
    make_shards(tmp_path / "src", count=1, samples=SAMPLES, size=16384)
    source = tmp_path / "src" / "shard-000000.tar"
    before = _scenario(small_fs, "before", source, sharedfs_before(tmp_path / "before"), "{cache}/.sharedfs/inuse")
    # Before: a bare ENOSPC, an empty marker left behind, and a shard nobody can evict any more.
    assert before["full"].returncode != 0
    assert before["full"].stderr.strip().splitlines()[-1] == "OSError: [Errno 28] No space left on device"
    assert len(before["markers"]) == 1
    assert before["pinned"] and before["pinned_a_day_later"]

    fixed = _scenario(small_fs, "fixed", source, {"SHAREDFS_STRICT": "1"}, "{cache}/../.cache.sharedfs/inuse")
    error = fixed["full"].stderr.strip().splitlines()[-1]
    print("fixed:", error)
    assert fixed["full"].returncode != 0 and error.startswith("OSError: [Errno 28] No space left on device: ")
    assert f"in-use marker of {small_fs}/fixed/cache/{source.name}" in error and "free space" in error
    assert fixed["markers"] == []  # removed at once
    assert not fixed["pinned"]  # evicted as soon as there was space again


def test_an_unreadable_marker_pins_its_shard_for_a_bounded_time_only(tmp_path: Path) -> None:
    make_shards(tmp_path / "src", count=1, samples=SAMPLES)
    source = tmp_path / "src" / "shard-000000.tar"
    cache = tmp_path / "cache"
    env = {"SHAREDFS_STRICT": "1"}
    assert _run(READ, str(cache), str(source), env=env).returncode == 0
    # What a writer killed between create and write leaves (or an older sharedfs on ENOSPC).
    garbled = tmp_path / ".cache.sharedfs" / "inuse" / f"{key(source.name)}.1234.deadbeef"
    garbled.touch()
    assert _run(CLEAN, str(cache), env=env).returncode == 0
    assert (cache / source.name).exists()  # young: it may be a reader on another node still writing it
    old = time.time() - GARBLED_GRACE - 5
    os.utime(garbled, (old, old))
    assert _run(CLEAN, str(cache), env=env).returncode == 0
    assert not (cache / source.name).exists() and not garbled.exists()

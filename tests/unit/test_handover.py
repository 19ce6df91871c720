"""The handover rule's two inputs: the cache timeout a mount declares, and the last holder's record.

What a holder on another node sees is tested on real client mounts (tests/integration/
test_realfs_handover.py); here, on this machine's own filesystem, the parts that decide: which
timeout each client's options declare (a client that declares none costs nothing), and that a
record written by one node tells the next holder whether to wait, failing towards waiting.
"""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

import pytest

from sharedfs.locks import _handover
from sharedfs.model.fsinfo import FsInfo, Mount

_ids = itertools.count(1_000_000)  # each made mount is a mount of its own (settle times are kept per mount)


def _fs(fstype: str, source: str = "", client_options: dict[str, str | None] | None = None,
        mount_point: str = "/nonexistent-mount") -> FsInfo:
    mount = Mount(mount_point=mount_point, fstype=fstype, source=source, mount_id=next(_ids),
                  client_options=client_options)
    return FsInfo(mount=mount, kind="fuse", shared=True, flock="coherent", posix="coherent", o_excl_atomic=True)


@pytest.mark.parametrize(("fstype", "source", "options", "settle"), [
    ("fuse.glusterfs", "10.0.0.1:/vol", {"attribute-timeout": "3", "entry-timeout": "3", "negative-timeout": "3"}, 3.0),
    ("fuse.glusterfs", "10.0.0.1:/vol", {}, 1.0),  # the client's documented defaults
    ("fuse", "mfs#10.0.0.1:9421", {"mfsattrcacheto": "3.000", "mfsnegentrycacheto": "5"}, 5.0),
    ("fuse.juicefs", "JuiceFS:vol", {"entry-cache": "2s"}, 2.0),  # no .config to read here: its command line
    ("fuse.s3fs", "s3fs", {}, 0.0),  # a bucket mount: no lock there at all
    ("ext4", "/dev/sda1", None, 0.0),
    ("nfs4", "server:/export", None, 0.0),
])
def test_the_settle_time_is_the_longest_cache_timeout_the_client_declares(
        fstype: str, source: str, options: dict[str, str | None], settle: float) -> None:
    assert _handover.settle_seconds(_fs(fstype, source, options)) == settle


def test_a_timeout_that_is_not_a_number_counts_as_none_and_a_huge_one_is_capped() -> None:
    assert _handover._seconds("soon") == 0.0
    assert _handover._seconds("500ms") == 0.5
    assert _handover.settle_seconds(_fs("fuse.glusterfs", "h:/big", {"entry-timeout": "86400"})) == \
        _handover.MAX_SETTLE


def _handover_on(lock: Path, node: str, settle: float = 0.3) -> _handover.Handover:
    return _handover.Handover(str(lock), settle, node, 0o644, poll_interval=0.05)


def test_the_next_holder_waits_only_after_another_node_or_when_it_cannot_tell(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    a, b = _handover_on(lock, "node-a"), _handover_on(lock, "node-b")

    def waited(rule: _handover.Handover) -> float:
        start = time.monotonic()
        rule.arrive()
        return time.monotonic() - start

    assert waited(a) < 0.2  # nobody held it before: nothing to wait for
    a.depart()
    assert waited(a) < 0.2  # the same node: one kernel, one cache
    a.depart()
    assert waited(b) >= 0.3  # another node: its caches may still hold what a replaced
    b.depart()
    (tmp_path / "x.lock.last").write_bytes(b"garbage")
    assert waited(b) >= 0.3  # cannot tell: wait
    os.unlink(tmp_path / "x.lock.last")
    os.symlink("/etc/passwd", tmp_path / "x.lock.last")
    assert waited(a) >= 0.3  # not a file sharedfs wrote: cannot tell, and nothing is written through it
    a.depart()
    assert os.path.islink(tmp_path / "x.lock.last") is False  # the planted link was removed, not followed


def test_a_holder_lets_go_for_another_nodes_ask_for_a_bounded_time(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    a, b = _handover_on(lock, "node-a", settle=0.0), _handover_on(lock, "node-b", settle=0.0)
    b.ask()
    with pytest.raises(_handover.Yield):
        a.arrive()
    a.honour_for = 0.0  # the asker never came: the ask is cleared, not honoured forever
    time.sleep(a.ask_every)
    a.arrive()
    assert not (tmp_path / "x.lock.want").exists()
    b.ask()
    b.arrive()  # the asker's node takes it: the ask is answered
    assert not (tmp_path / "x.lock.want").exists()


def test_a_record_name_linked_to_another_file_is_replaced_and_the_file_left_alone(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    precious = tmp_path / "precious"
    precious.write_bytes(b"mine")
    os.link(precious, tmp_path / "x.lock.last")  # someone who may write the directory linked it there
    rule = _handover_on(lock, "node-a")
    rule.arrive()  # cannot tell (not a record): waits
    rule.depart()
    assert precious.read_bytes() == b"mine"
    assert os.stat(tmp_path / "x.lock.last").st_ino != precious.stat().st_ino
    assert _handover._parse((tmp_path / "x.lock.last").read_bytes(), "last") == _handover._tag("node-a")

"""FUSE clients by name: real ``/proc/self/mountinfo`` lines of each client the table knows, classified.

Before this table every ``fuse.*`` mount but ceph-fuse went through the generic FUSE rule, which
calls it "fuse", trusts no lock and so picks the existence lock; each test shows that answer first
(the rule is still there for FUSE filesystems nobody named), then what the named client gets.

The JuiceFS, MooseFS and GlusterFS lines are the ones their clients printed here (JuiceFS 1.4.2,
GlusterFS 10.3; mfsmount 3.0.117 mounts as plain ``fuse`` with the source ``mfs#<master>:9421``),
and so is s3fs's (1.90); 3FS's is its README's
``mount`` output written as mountinfo; gcsfuse, blobfuse2 and Mountpoint for Amazon S3 (fsname
``mountpoint-s3`` and no subtype) are in the form their FUSE options give.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from sharedfs.errors import NoSafeLockError
from sharedfs.model.fsinfo import Mount, parse_mountinfo
from sharedfs.model.mounts import FUSE_CLIENTS, _argv_options, _params_file_options, fuse_client
from sharedfs.model.policy import resolve
from sharedfs.plugins import filesystem, locking

LINES = {
    "juicefs": r"54 27 0:43 / /jfs rw,nosuid,nodev,relatime - fuse.juicefs JuiceFS:sfsn rw,user_id=0,group_id=0,default_permissions,allow_other,max_read=131072",
    "moosefs": r"77 27 0:47 / /mfs rw,nosuid,nodev,relatime - fuse mfs\04310.213.93.78:9421 rw,user_id=0,group_id=0,allow_other",
    "glusterfs": r"47 27 0:41 / /gluster rw,relatime - fuse.glusterfs 10.213.234.34:sfs14161x1 rw,user_id=0,group_id=0,default_permissions,allow_other,max_read=131072",
    "ceph-fuse": r"561 27 0:101 / /cephfuse rw,nosuid,nodev,relatime shared:351 - fuse.ceph-fuse ceph-fuse rw,user_id=0,group_id=0,allow_other",
    "3fs": r"90 27 0:60 / /3fs rw,nosuid,nodev,relatime - fuse.hf3fs hf3fs.open3fs rw,user_id=0,group_id=0,default_permissions,allow_other,max_read=1048576",
    "gcsfuse": r"44 73 0:43 / /gcs rw,nosuid,nodev,relatime shared:49 - fuse.gcsfuse my-bucket rw,user_id=2001,group_id=2001,default_permissions",
    "blobfuse2": r"45 73 0:44 / /blob rw,nosuid,nodev,relatime - fuse.blobfuse2 blobfuse2 rw,user_id=0,group_id=0,allow_other",
    "mountpoint-s3": r"46 73 0:45 / /s3 rw,nosuid,nodev,noatime - fuse mountpoint-s3 rw,user_id=0,group_id=0,default_permissions,allow_other",
    "s3fs": r"54 27 0:41 / /s3fs rw,nosuid,nodev,relatime - fuse.s3fs s3fs rw,user_id=0,group_id=0",
}

#: line -> (kind, name starts with, flock, posix, hard_links, o_excl_atomic, the lock sharedfs takes or None: refused)
EXPECTED = {
    "juicefs": ("juicefs", "JuiceFS", "coherent", "coherent", True, True, "flock"),
    # No .params was read for this sample line: whether mfsnobsdlocks is set cannot be told.
    "moosefs": ("moosefs", "MooseFS", "node-local", "node-local", True, True, "soft"),
    "glusterfs": ("glusterfs", "GlusterFS", "coherent", "coherent", True, True, "flock"),
    "ceph-fuse": ("cephfs", "CephFS", "coherent", "coherent", True, True, "flock"),
    "3fs": ("3fs", "3FS", "node-local", "node-local", True, True, "soft"),
    "gcsfuse": ("bucket", "gcsfuse", "node-local", "node-local", False, False, None),
    "blobfuse2": ("bucket", "blobfuse2", "node-local", "node-local", False, False, None),
    "mountpoint-s3": ("bucket", "Mountpoint for Amazon S3", "node-local", "node-local", False, False, None),
    "s3fs": ("bucket", "s3fs", "node-local", "node-local", False, False, None),
}


def _mount(name: str, **changes: object) -> Mount:
    (mount,) = parse_mountinfo(LINES[name])
    return replace(mount, **changes)  # type: ignore[arg-type]


def _lock(info: object) -> str | None:
    try:
        return locking.decide(info, resolve([])).kind  # type: ignore[arg-type]
    except NoSafeLockError:
        return None


@pytest.mark.parametrize("name", list(LINES))
def test_the_generic_fuse_rule_calls_each_one_fuse_and_trusts_no_lock(name: str) -> None:
    # What sharedfs at 18c02b8 answered for every one of these but ceph-fuse.
    before = filesystem._fuse(_mount(name))
    assert (before.kind, before.flock, before.posix, before.name) == ("fuse", "node-local", "node-local", None)
    assert _lock(before) == "soft"


@pytest.mark.parametrize("name", list(LINES))
def test_each_client_is_named_with_its_documented_facts(name: str) -> None:
    kind, title, flock, posix, links, o_excl, lock = EXPECTED[name]
    info = filesystem.classify(_mount(name))
    assert (info.kind, info.flock, info.posix, info.hard_links, info.o_excl_atomic) == (kind, flock, posix, links, o_excl)
    assert info.name is not None and info.name.startswith(title) and info.shared
    assert _lock(info) == lock
    assert info.notes and all(note.endswith(".") for note in info.notes)
    json.dumps(info.as_dict())
    assert info.as_dict()["name"] == info.name


def test_every_row_of_the_table_is_reached_by_a_line() -> None:
    assert {fuse_client(_mount(name)).name for name in LINES} == {c.name for c in FUSE_CLIENTS}  # type: ignore[union-attr]


def test_a_bucket_mount_refuses_every_kind_of_lock_in_one_line() -> None:
    info = filesystem.classify(_mount("gcsfuse"))
    for asked in ("auto", "flock", "posix", "soft", "lease"):
        with pytest.raises(NoSafeLockError) as refused:
            locking.decide(info, resolve([]) if asked == "auto" else _policy(asked))
        message = str(refused.value)
        assert "\n" not in message and "/gcs" in message and "gcsfuse" in message and "SHAREDFS_CACHE" in message


def _policy(lock: str) -> object:
    from sharedfs.model.policy import explicit_layer

    return resolve([explicit_layer({"lock": lock})])


@pytest.mark.parametrize(
    ("options", "flock", "posix", "lock"),
    [
        ({}, "coherent", "coherent", "flock"),  # MooseFS's default: its own locks exclude across clients
        ({"mfsnobsdlocks": None}, "node-local", "coherent", "posix"),
        ({"mfsnoposixlocks": None}, "coherent", "node-local", "flock"),
        ({"mfsnobsdlocks": None, "mfsnoposixlocks": None}, "node-local", "node-local", "soft"),
        (None, "node-local", "node-local", "soft"),  # .params not readable: cannot tell
    ],
)
def test_moosefs_lock_options_decide_its_locks(options: dict[str, None] | None, flock: str, posix: str,
                                               lock: str) -> None:
    info = filesystem.classify(_mount("moosefs", client_options=options))
    assert (info.flock, info.posix, _lock(info)) == (flock, posix, lock)
    if options:
        assert any(name in note for note in info.notes for name in options)


def test_cache_timeouts_as_started_else_the_documented_defaults() -> None:
    started = filesystem.classify(_mount("juicefs", client_options={"attr-cache": "3"}))
    assert any("attr-cache=3," in note and "entry-cache=1 (default)" in note for note in started.notes)


# -- the option parsers, on the clients' real command lines and parameter file ----------------------


def test_juicefs_command_line_as_its_process_title_shows_it() -> None:
    argv = "mount -d sqlite3:///tmp/sfsn/meta.db /tmp/sfsn/m1 --attr-cache 3 --log /tmp/sfsn/m1.log".split()
    valued = frozenset({"attr-cache", "entry-cache", "dir-entry-cache", "negative-entry-cache"})
    assert _argv_options(argv, valued) == {"attr-cache": "3", "log": None}


def test_glusterfs_and_s3fs_command_lines() -> None:
    gluster = ["-N", "--volfile-server=10.0.0.1", "--volfile-id=gv0", "-l", "/tmp/g.log", "--attribute-timeout=3",
               "--entry-timeout=3", "/mnt/g"]
    assert _argv_options(gluster, frozenset()) == {"volfile-server": "10.0.0.1", "volfile-id": "gv0",
                                                  "attribute-timeout": "3", "entry-timeout": "3"}
    s3fs = ["bucket", "/mnt/s3", "-o", "url=http://127.0.0.1:5000,use_path_request_style", "-ostat_cache_expire=1"]
    assert _argv_options(s3fs, frozenset()) == {"url": "http://127.0.0.1:5000", "use_path_request_style": None,
                                               "stat_cache_expire": "1"}


PARAMS = """\
mfsnobsdlocks: (defined)
mfsnoposixlocks: (not defined)
mfscachemode: (not defined)
mfsattrcacheto: 1.000
mfsentrycacheto: 0.000
working_keep_cache_mode: AUTO
"""


def test_moosefs_params_file(tmp_path: Path) -> None:
    (tmp_path / ".params").write_text(PARAMS)
    mount = Mount(str(tmp_path), "fuse", "mfs#10.0.0.1:9421")
    client = fuse_client(mount)
    assert client is not None and client.name == "MooseFS"
    assert _params_file_options(mount, client) == {"mfsnobsdlocks": None, "mfsattrcacheto": "1.000",
                                                   "mfsentrycacheto": "0.000", "working_keep_cache_mode": "AUTO"}
    (tmp_path / ".params").unlink()
    (tmp_path / ".params").symlink_to(tmp_path / "elsewhere")
    assert _params_file_options(mount, client) is None  # never followed: "cannot tell"

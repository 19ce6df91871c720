"""Mount parsing, mount lookup and filesystem classification.

The cluster filesystems cannot be mounted here, so their mountinfo lines are
realistic samples in the form the kernels print them (NFS's option order from
nfs_show_mount_options, Lustre's from ll_show_options); the lookups run against
this machine's real mounts, including tmpfs mounts the tests make as root.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pluggy
import pytest
from harness.skips import skip_or_fail

from sharedfs.machinery import hookspecs
from sharedfs.model.fsinfo import MAGIC, FsInfo, Mount, parse_mountinfo
from sharedfs.model.mounts import clear_mount_cache, mount_for, statfs_magic
from sharedfs.model.policy import resolve
from sharedfs.plugins import filesystem, locking


def _safe(info: FsInfo) -> str | None:
    """The native lock the one lock decision (plugins/locking.py) picks under lock=auto, or None (existence lock)."""
    kind = locking.decide(info, resolve([])).kind
    return kind if kind in locking.NATIVE else None


SAMPLE = r"""
27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,discard
25 24 0:23 / /dev/shm rw,nosuid,nodev shared:4 - tmpfs tmpfs rw,inode64
22 27 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
600 27 0:120 / /var/lib/docker/overlay2/x/merged rw,relatime - overlay overlay rw,lowerdir=/var/lib/docker/overlay2/l/AB:/var/lib/docker/overlay2/l/CD,upperdir=/var/lib/docker/overlay2/x/diff,workdir=/var/lib/docker/overlay2/x/work
512 27 0:52 / /lustre/scratch rw,relatime shared:300 - lustre 10.10.0.1@o2ib:10.10.0.2@o2ib:/scratch rw,flock,lazystatfs,encrypt
513 27 0:53 / /lustre/home rw,relatime shared:301 - lustre 10.10.0.1@o2ib:/home rw,localflock,lazystatfs
514 27 0:54 / /lustre/project rw,nosuid,nodev,relatime shared:302 - lustre mgs01@tcp:/project rw,lazystatfs
520 27 0:60 / /gpfs/fs1 rw,relatime shared:310 - gpfs fs1 rw
530 27 0:70 / /mnt/nfs3 rw,relatime shared:320 - nfs 10.0.0.5:/export/data rw,vers=3,rsize=1048576,wsize=1048576,namlen=255,hard,nolock,proto=tcp,timeo=600,retrans=2,sec=sys,mountaddr=10.0.0.5,mountvers=3,mountport=20048,mountproto=udp,local_lock=all,addr=10.0.0.5
531 27 0:71 / /mnt/nfs3lock rw,relatime shared:321 - nfs 10.0.0.5:/export/home rw,vers=3,rsize=1048576,wsize=1048576,namlen=255,hard,proto=tcp,timeo=600,retrans=2,sec=sys,mountaddr=10.0.0.5,mountvers=3,mountport=20048,mountproto=udp,local_lock=none,addr=10.0.0.5
540 27 0:80 / /mnt/nfs4local rw,relatime shared:330 - nfs4 nfs.example.org:/ml rw,vers=4.2,rsize=1048576,wsize=1048576,namlen=255,hard,proto=tcp,timeo=600,retrans=2,sec=sys,clientaddr=10.0.0.21,local_lock=all,addr=10.0.0.5
541 27 0:81 / /mnt/nfs4 rw,relatime shared:331 - nfs4 nfs.example.org:/ml rw,vers=4.1,rsize=1048576,wsize=1048576,namlen=255,hard,proto=tcp,timeo=600,retrans=2,sec=sys,clientaddr=10.0.0.21,local_lock=none,addr=10.0.0.5
542 27 0:82 / /mnt/nfs4flock rw,relatime shared:332 - nfs4 nfs.example.org:/ml rw,vers=4.2,hard,proto=tcp,sec=sys,clientaddr=10.0.0.21,local_lock=flock,addr=10.0.0.5
543 27 0:83 / /mnt/nfs2 rw,relatime shared:333 - nfs 10.0.0.5:/old rw,vers=2,hard,proto=udp,sec=sys,local_lock=none,addr=10.0.0.5
550 27 0:90 / /mnt/beegfs rw,relatime shared:340 - beegfs beegfs_nodev rw,cfgFile=/etc/beegfs/beegfs-client.conf,_netdev
560 27 0:100 / /mnt/cephfs rw,relatime shared:350 - ceph 10.0.0.11:6789,10.0.0.12:6789,10.0.0.13:6789:/ rw,name=admin,secret=<hidden>,fsid=00000000-0000-0000-0000-000000000000,acl
561 27 0:101 / /mnt/cephfuse rw,nosuid,nodev,relatime shared:351 - fuse.ceph-fuse ceph-fuse rw,user_id=0,group_id=0,allow_other
570 27 0:110 / /mnt/smb rw,relatime shared:360 - cifs //fileserver/share rw,vers=3.1.1,cache=strict,username=alice,uid=1000,noforceuid,gid=1000,noforcegid,addr=10.0.0.30,file_mode=0755,dir_mode=0755,soft,nounix,serverino,mapposix,rsize=4194304,wsize=4194304,bsize=1048576,echo_interval=60,actimeo=1,closetimeo=1
571 27 0:111 / /mnt/smbnobrl rw,relatime shared:361 - smb3 //fileserver/scratch rw,vers=3.0,cache=strict,username=alice,uid=1000,nobrl,addr=10.0.0.30,soft,nounix,serverino
580 27 0:130 / /mnt/hostile rw,nosuid,nodev,relatime shared:370 - fuse.hostilefs hostilefs rw,user_id=0,group_id=0,default_permissions,allow_other
590 27 8:17 /data\040dir /mnt/my\040data\134x rw,relatime shared:380 master:7 propagate_from:2 - ext4 /dev/sdb1 rw
591 27 0:140 / /mnt/selinux rw,relatime - tmpfs  rw,context="system_u:object_r:container_file_t:s0:c1,c2",size=1024k
"""

#: mount point -> (kind, shared, flock, flock_errno, posix, o_excl_atomic, safe_lock)
EXPECTED = {
    "/": ("local", False, "coherent", None, "coherent", True, "flock"),
    "/dev/shm": ("tmpfs", False, "coherent", None, "coherent", True, "flock"),
    "/proc": ("local", False, "coherent", None, "coherent", True, "flock"),
    "/var/lib/docker/overlay2/x/merged": ("overlay", False, "coherent", None, "coherent", True, "flock"),
    "/lustre/scratch": ("lustre", True, "coherent", None, "coherent", True, "flock"),
    "/lustre/home": ("lustre", True, "node-local", None, "node-local", True, None),
    "/lustre/project": ("lustre", True, "absent", "ENOSYS", "absent", True, None),
    "/gpfs/fs1": ("gpfs", True, "node-local", None, "coherent", True, "posix"),
    "/mnt/nfs3": ("nfs", True, "node-local", None, "node-local", True, None),
    "/mnt/nfs3lock": ("nfs", True, "coherent", None, "coherent", True, "flock"),
    "/mnt/nfs4local": ("nfs", True, "node-local", None, "node-local", True, None),
    "/mnt/nfs4": ("nfs", True, "coherent", None, "coherent", True, "flock"),
    "/mnt/nfs4flock": ("nfs", True, "node-local", None, "coherent", True, "posix"),
    "/mnt/nfs2": ("nfs", True, "coherent", None, "coherent", False, "flock"),
    "/mnt/beegfs": ("beegfs", True, "node-local", None, "node-local", True, None),
    "/mnt/cephfs": ("cephfs", True, "coherent", None, "coherent", True, "flock"),
    "/mnt/cephfuse": ("cephfs", True, "coherent", None, "coherent", True, "flock"),
    "/mnt/smb": ("cifs", True, "node-local", None, "coherent", True, "posix"),
    "/mnt/smbnobrl": ("cifs", True, "node-local", None, "node-local", True, None),
    "/mnt/hostile": ("fuse", True, "node-local", None, "node-local", False, None),
    "/mnt/my data\\x": ("local", False, "coherent", None, "coherent", True, "flock"),
    "/mnt/selinux": ("tmpfs", False, "coherent", None, "coherent", True, "flock"),
}


def _by_mount_point() -> dict[str, Mount]:
    return {m.mount_point: m for m in parse_mountinfo(SAMPLE)}


# -- parse_mountinfo ---------------------------------------------------------------------------


def test_parse_mountinfo_reads_every_sample_line() -> None:
    mounts = parse_mountinfo(SAMPLE)
    assert [m.mount_point for m in mounts] == list(EXPECTED)


def test_parse_mountinfo_fields_of_a_lustre_line() -> None:
    lustre = _by_mount_point()["/lustre/scratch"]
    assert lustre.mount_id == 512
    assert lustre.device == "0:52"
    assert lustre.root == "/"
    assert lustre.fstype == "lustre"
    assert lustre.source == "10.10.0.1@o2ib:10.10.0.2@o2ib:/scratch"
    assert lustre.magic is None  # mountinfo has no magic; mount_for fills it in
    assert lustre.raw_options == "rw,relatime,rw,flock,lazystatfs,encrypt"
    assert lustre.options == {"rw": None, "relatime": None, "flock": None, "lazystatfs": None, "encrypt": None}


def test_parse_mountinfo_merges_superblock_options_with_values() -> None:
    nfs = _by_mount_point()["/mnt/nfs3"]
    assert nfs.options["vers"] == "3"
    assert nfs.options["local_lock"] == "all"
    assert "nolock" in nfs.options and nfs.options["nolock"] is None
    assert nfs.options["relatime"] is None  # from the per-mount half


def test_parse_mountinfo_decodes_octal_escapes_and_skips_optional_fields() -> None:
    mount = parse_mountinfo(SAMPLE)[-2]
    assert mount.mount_point == "/mnt/my data\\x"
    assert mount.root == "/data dir"
    assert mount.fstype == "ext4"
    assert mount.source == "/dev/sdb1"


def test_parse_mountinfo_keeps_quoted_commas_and_an_empty_source() -> None:
    mount = _by_mount_point()["/mnt/selinux"]
    assert mount.source == ""
    assert mount.options["context"] == '"system_u:object_r:container_file_t:s0:c1,c2"'
    assert mount.options["size"] == "1024k"


def test_parse_mountinfo_skips_a_malformed_line_without_hiding_the_rest() -> None:
    text = "garbage without separator\n" + SAMPLE
    assert len(parse_mountinfo(text)) == len(EXPECTED)


def test_parse_mountinfo_of_one_device_is_the_whole_tables_lines_of_that_device() -> None:
    # mount_for reads only the lines of the device a lock is on (a node may list hundreds of
    # mounts); what it gets must be what parsing everything and filtering would give.
    mounts = parse_mountinfo(SAMPLE)
    for device in {m.device for m in mounts}:
        assert parse_mountinfo(SAMPLE, device) == [m for m in mounts if m.device == device], device
    assert parse_mountinfo("garbage\n\n36 35\n" + SAMPLE, "0:52") == [_by_mount_point()["/lustre/scratch"]]
    assert parse_mountinfo(SAMPLE, "999:999") == []


def test_unquoted_options_split_as_the_quote_aware_splitter_does() -> None:
    from sharedfs.model.fsinfo import _split_options

    for text in ("rw,relatime", "rw,,vers=3,,", ",", "", "a=b=c,d", 'x,context="a,b",y'):
        slow = []  # the quote-aware character loop the plain split stands in for
        current, quoted = "", False
        for char in text:
            quoted = not quoted if char == '"' else quoted
            if char == "," and not quoted:
                slow.append(current)
                current = ""
            else:
                current += char
        slow.append(current)
        assert _split_options(text) == [part for part in slow if part], text


def test_parse_mountinfo_of_this_machine() -> None:
    with open("/proc/self/mountinfo") as f:
        mounts = parse_mountinfo(f.read())
    assert any(m.mount_point == "/" for m in mounts)
    assert all(m.mount_id >= 0 and ":" in m.device for m in mounts)


def test_mount_is_hashable_and_read_only_is_reported() -> None:
    mounts = parse_mountinfo(SAMPLE)
    assert len({m for m in mounts}) == len(mounts)
    ro = Mount("/x", "tmpfs", options={"ro": None})
    assert ro.read_only and not mounts[0].read_only
    assert _by_mount_point()["/mnt/hostile"].subtype == "hostilefs"


# -- classify ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mount_point", list(EXPECTED))
def test_classify(mount_point: str) -> None:
    kind, shared, flock, flock_errno, posix, o_excl, safe = EXPECTED[mount_point]
    info = filesystem.classify(_by_mount_point()[mount_point])
    assert (info.kind, info.shared, info.flock, info.flock_errno, info.posix, info.o_excl_atomic) == (
        kind,
        shared,
        flock,
        flock_errno,
        posix,
        o_excl,
    )
    assert _safe(info) == safe
    assert info.notes and all(note.endswith(".") for note in info.notes)
    json.dumps(info.as_dict())


def test_lustre_localflock_note_says_node_local() -> None:
    info = filesystem.classify(_by_mount_point()["/lustre/home"])
    assert "localflock" in info.notes[0] and "same node" in info.notes[0]


def test_nfs_nolock_note_explains_the_implied_local_lock() -> None:
    info = filesystem.classify(_by_mount_point()["/mnt/nfs3"])
    assert any("nolock" in note and "local_lock=all" in note for note in info.notes)


def test_nfs3_with_locking_warns_about_enolck() -> None:
    info = filesystem.classify(_by_mount_point()["/mnt/nfs3lock"])
    assert any("ENOLCK" in note for note in info.notes)


def test_unknown_filesystem_is_shared_without_a_trusted_lock() -> None:
    info = filesystem.classify(Mount("/mnt/weird", "weirdfs", "server:/vol"))
    assert info.kind == "unknown" and info.shared
    assert _safe(info) is None and not info.o_excl_atomic


@pytest.mark.parametrize(
    ("magic", "kind", "flock"),
    [
        (MAGIC["lustre"], "lustre", "absent"),
        (MAGIC["gpfs"], "gpfs", "node-local"),
        (MAGIC["nfs"], "nfs", "coherent"),
        (MAGIC["beegfs"], "beegfs", "node-local"),
        (MAGIC["cephfs"], "cephfs", "coherent"),
        (MAGIC["smb2"], "cifs", "node-local"),
        (MAGIC["fuse"], "fuse", "node-local"),
        (MAGIC["tmpfs"], "tmpfs", "coherent"),
        (MAGIC["xfs"], "local", "coherent"),
    ],
)
def test_classify_falls_back_to_the_statfs_magic(magic: int, kind: str, flock: str) -> None:
    info = filesystem.classify(Mount("/", "unknown", magic=magic))
    assert (info.kind, info.flock) == (kind, flock)


def test_fsinfo_rejects_a_misspelt_state() -> None:
    mount = Mount("/", "ext4")
    with pytest.raises(ValueError, match="flock"):
        FsInfo(mount=mount, kind="local", shared=False, flock="coherant", posix="coherent", o_excl_atomic=True)
    with pytest.raises(ValueError, match="kind"):
        FsInfo(mount=mount, kind="ext4", shared=False, flock="coherent", posix="coherent", o_excl_atomic=True)


def test_safe_lock_on_a_node_local_filesystem_accepts_a_node_wide_lock() -> None:
    mount = Mount("/", "ext4")
    info = FsInfo(mount=mount, kind="local", shared=False, flock="node-local", posix="absent", o_excl_atomic=True)
    assert _safe(info) == "flock"
    info = FsInfo(mount=mount, kind="local", shared=False, flock="absent", posix="node-local", o_excl_atomic=True)
    assert _safe(info) == "posix"


def test_hook_answers_through_pluggy() -> None:
    pm = pluggy.PluginManager(hookspecs.NAME)
    pm.add_hookspecs(hookspecs)
    pm.register(filesystem)
    info = pm.hook.sharedfs_classify_filesystem(mount=_by_mount_point()["/gpfs/fs1"])
    assert isinstance(info, FsInfo) and _safe(info) == "posix"


# -- statfs_magic and mount_for on this machine ------------------------------------------------


def test_statfs_magic() -> None:
    assert statfs_magic("/proc") == MAGIC["proc"]
    assert statfs_magic("/no/such/path") is None


def test_mount_for_proc() -> None:
    mount = mount_for("/proc/self")
    assert (mount.mount_point, mount.fstype, mount.magic) == ("/proc", "proc", MAGIC["proc"])


def test_mount_for_a_path_that_does_not_exist_yet(tmp_path: Path) -> None:
    missing = tmp_path / "not" / "yet" / "here.lock"
    mount = mount_for(missing)
    assert mount == mount_for(tmp_path)
    assert str(tmp_path).startswith(mount.mount_point)
    assert mount.magic == statfs_magic(tmp_path)


def test_mount_for_has_cache_clear() -> None:
    mount_for("/")
    mount_for.cache_clear()  # type: ignore[attr-defined]
    assert mount_for("/").mount_point == "/"


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True)


@pytest.fixture
def mounter() -> Iterator[object]:
    """Mount as root; unmount everything (innermost first) afterwards."""
    if os.geteuid() != 0:
        skip_or_fail("mounting needs root")
    made: list[str] = []

    def mount(*args: str) -> None:
        try:
            _mount(*args)
        except (OSError, subprocess.CalledProcessError) as exc:
            skip_or_fail(f"cannot mount here: {exc}")
        made.append(args[-1])
        clear_mount_cache()

    yield mount
    for target in reversed(made):
        subprocess.run(["umount", "-l", target], check=False, capture_output=True)
    clear_mount_cache()


def test_mount_for_a_tmpfs_mounted_by_the_test(tmp_path: Path, mounter) -> None:  # type: ignore[no-untyped-def]
    target = tmp_path / "dir with space"
    target.mkdir()
    mounter("-t", "tmpfs", "-o", "size=1m", "tmpfs", str(target))
    mount = mount_for(target / "sub" / "missing.lock")
    assert mount.mount_point == str(target)  # \040 decoded from the real mountinfo
    assert (mount.fstype, mount.magic) == ("tmpfs", MAGIC["tmpfs"])
    assert filesystem.classify(mount).kind == "tmpfs"

    link = tmp_path / "link"
    link.symlink_to(target)
    assert mount_for(link / "x").mount_point == str(target)

    subprocess.run(["umount", str(target)], check=True)
    mount_for.cache_clear()  # type: ignore[attr-defined]
    assert mount_for(target).mount_point != str(target)


def test_mount_for_sees_through_a_mount_stacked_over_earlier_ones(tmp_path: Path, mounter) -> None:  # type: ignore[no-untyped-def]
    # /d (tmpfs A), /d/b (tmpfs B), then tmpfs C mounted over /d hides both.
    # The longest listed mount point containing /d/b is B's, yet /d/b now
    # resolves inside C: the device number must win over the prefix.
    d = tmp_path / "d"
    d.mkdir()
    mounter("-t", "tmpfs", "-o", "size=1m", "tmpfs-a", str(d))
    (d / "b").mkdir()
    mounter("-t", "tmpfs", "-o", "size=1m", "tmpfs-b", str(d / "b"))
    mounter("-t", "tmpfs", "-o", "size=1m", "tmpfs-c", str(d))
    (d / "b").mkdir()
    mount = mount_for(d / "b")
    assert (mount.mount_point, mount.source) == (str(d), "tmpfs-c")


def test_mount_for_a_bind_mount_names_the_bind_mount_point(tmp_path: Path, mounter) -> None:  # type: ignore[no-untyped-def]
    d = tmp_path / "d"
    d.mkdir()
    mounter("-t", "tmpfs", "-o", "size=1m", "tmpfs-bind", str(d))
    (d / "x").mkdir()
    (d / "y").mkdir()
    mounter("--bind", str(d / "x"), str(d / "y"))
    outer, bound = mount_for(d / "x"), mount_for(d / "y" / "f")
    assert outer.device == bound.device  # one filesystem, one st_dev ...
    assert (outer.mount_point, bound.mount_point) == (str(d), str(d / "y"))  # ... two mounts
    assert bound.root == "/x"


# -- a FUSE client's own options, read from its real process -----------------------------------------


def _posing_client(argv: list[str], user: object = None) -> subprocess.Popen[str]:
    """A real process whose command line is ``argv`` (argv[0] as given): /bin/sh sleeping under that name."""
    shell = ["-c", "sleep 60; :"]  # '; :' keeps sh from exec'ing sleep (its command line would change)
    if user is None:
        return subprocess.Popen([argv[0], *shell, *argv[1:]], executable="/bin/sh", text=True)
    return user.popen([argv[0], *shell, *argv[1:]], executable="/bin/sh")  # type: ignore[attr-defined]


def _names(pid: str, program: str, point: str) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return os.path.basename(argv[0]) == program.encode() and point.encode() in argv


def test_client_options_come_from_the_mounting_users_client_not_from_a_look_alike(tmp_path: Path) -> None:
    from helpers.unixusers import throwaway_users

    from sharedfs.model.mounts import client_options, fuse_client

    point = str(tmp_path / "jfs")
    mount = Mount(point, "fuse.juicefs", "JuiceFS:vol", options={"user_id": "0"})
    client = fuse_client(mount)
    assert client is not None and client.name == "JuiceFS"
    assert client_options(mount, client) is None  # no client process: cannot tell

    real = _posing_client(["juicefs", "mount", "-d", "sqlite3:///x/meta.db", point, "--attr-cache", "3"])
    try:
        with throwaway_users(1) as (mallory,):
            # Another user starts a process that looks like the client, claiming other caches.
            fake = _posing_client(["juicefs", "mount", "-d", "sqlite3:///y", point, "--attr-cache", "99",
                                   "--entry-cache=99"], mallory)
            try:
                deadline = time.monotonic() + 10
                while b"99" not in Path(f"/proc/{fake.pid}/cmdline").read_bytes():
                    assert time.monotonic() < deadline
                    time.sleep(0.05)
                # The look-alike is there for anyone reading every command line: a reader that took any
                # process naming the client and the mount point would merge its 99 s caches in ...
                named = [pid for pid in os.listdir("/proc") if pid.isdigit() and _names(pid, "juicefs", point)]
                # (a superset: in a full run another test's process may briefly name the same words)
                assert {real.pid, fake.pid} <= {int(pid) for pid in named}, named
                assert os.stat(f"/proc/{fake.pid}").st_uid == mallory.uid
                # ... and ignored: only processes of the user who mounted (user_id=) count.
                assert client_options(mount, client) == {"attr-cache": "3"}
                info = filesystem.classify(replace(mount, client_options=client_options(mount, client)))
                assert any("attr-cache=3," in note and "99" not in note for note in info.notes)
            finally:
                fake.kill()
                fake.wait()
    finally:
        real.kill()
        real.wait()


def test_status_path_names_the_filesystem_as_doctor_does(tmp_path: Path, mounter) -> None:  # type: ignore[no-untyped-def]
    import sys

    target = tmp_path / "t"
    target.mkdir()
    mounter("-t", "tmpfs", "-o", "size=1m", "tmpfs-status", str(target))
    missing = target / "not" / "yet"
    proc = subprocess.run([sys.executable, "-m", "sharedfs", "status", str(target), str(missing), "--json"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["paths"]
    assert [row["path"] for row in rows] == [str(target), str(missing)]
    for row in rows:  # a path that does not exist yet is on the filesystem of its nearest existing parent
        assert (row["name"], row["filesystem"]["mount"]["mount_point"]) == ("tmpfs (memory)", str(target))
        assert row["lock"]["kind"] == "flock"
    text = subprocess.run([sys.executable, "-m", "sharedfs", "status", str(target)], capture_output=True, text=True,
                          check=False).stdout
    assert f"{target}: tmpfs (memory) (tmpfs at {target}), this node only" in text

"""Hostile neighbours in a group-shared wids cache: real users, real group, a real 2775 project directory.

A project shares one shard cache: the directory is group-writable (2775), and so
is sharedfs's coordination tree beside it, so any member can rename entries and
plant symlinks or FIFOs there.  Each test first runs the scenario against
sharedfs as it was (:data:`shardcache_support.BEFORE`) and shows the damage, then
against this checkout and shows it refused:

* a symlink swapped in for the victim's download claim while she downloads: the
  old code rewrote the claim in place through its path, so the victim's own 0600
  file at the symlink's target was overwritten with a JSON record;
* a FIFO planted under the name of a shard's claim: the old code opened it to
  read the record and waited forever for a writer.
"""

from __future__ import annotations

import os
import re
import stat
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.skips import skip_or_fail
from helpers import require
from helpers.shardcache_support import User, group_of_users, scratch, sharedfs_before

from sharedfs.demo.shardserver import make_shards, wait_until
from sharedfs.shardcache import key

require("wids", "needs wids==0.1.11 (scripts/requirements-test.txt)")
require("torch", "needs torch==2.13.0: wids imports torch.distributed")

# xdist_group: the module's throwaway users, made once.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("test_shardcache_neighbours")]
SECRET = b"the victim's private key\n"

# The victim's job: open one shard through wids' download_and_open.  Her download handler (wids
# takes a callable per URL scheme) announces that it started, then waits for the test's go-ahead:
# the attacker acts while the download is in progress, deterministically.
VICTIM = textwrap.dedent("""
    import os, shutil, sys, time
    import wids.wids_dl as dl
    source, cache, started, go = sys.argv[1:5]

    def slow_copy(remote, local):
        open(started, "w").close()
        while not os.path.exists(go):
            time.sleep(0.01)
        shutil.copyfile(source, local)

    handlers = dict(dl.default_cmds, file=slow_copy)
    with dl.download_and_open("file://" + source, os.path.join(cache, os.path.basename(source)),
                              handlers=handlers) as stream:
        print(len(stream.read()), flush=True)
""")

# The attacker, a member of the same group: replace the claim with a symlink to the victim's file.
SWAP = textwrap.dedent("""
    import glob, os, sys
    pattern, target = sys.argv[1:3]
    (claim,) = glob.glob(pattern)
    os.unlink(claim)
    os.symlink(target, claim)
    print(claim)
""")

# The attacker plants a FIFO where the claim of a shard will be (its name is predictable).
PLANT_FIFO = textwrap.dedent("""
    import os, sys
    claims = sys.argv[1]
    os.makedirs(claims, exist_ok=True)
    os.mkfifo(os.path.join(claims, sys.argv[2]))
""")


@pytest.fixture(scope="module")
def site() -> Iterator[tuple[Path, User, User]]:
    """A scratch root, the victim and the attacker (both in one project group)."""
    with scratch() as root, group_of_users(2, root) as (victim, attacker):
        yield root, victim, attacker


@pytest.fixture(scope="module")
def before(site: tuple[Path, User, User]) -> dict[str, str]:
    return sharedfs_before(site[0] / "before")


def _project(root: Path, label: str, victim: User) -> tuple[Path, Path, Path]:
    """``<root>/<label>/proj`` (root:group 2775) with the cache in it, the shard source and the signals dir."""
    base = root / label
    proj = base / "proj"
    proj.mkdir(parents=True)
    os.chown(proj, 0, victim.group)
    proj.chmod(0o2775)
    cache = proj / "cache"
    cache.mkdir()
    os.chown(cache, victim.uid, victim.group)
    cache.chmod(0o2775)
    make_shards(base / "src", count=1, samples=5)
    for path in (base / "src", *(base / "src").iterdir()):
        path.chmod(0o755 if path.is_dir() else 0o644)
    signals = base / "signals"
    signals.mkdir()
    os.chown(signals, victim.uid, victim.gid)
    return cache, base / "src" / "shard-000000.tar", signals


def _secret(victim: User, label: str) -> Path:
    secret = victim.home / f"id_{label}"
    secret.write_bytes(SECRET)
    os.chown(secret, victim.uid, victim.gid)
    secret.chmod(0o600)
    return secret


def _swap_during_download(root: Path, label: str, victim: User, attacker: User, claims: str,
                          env: dict[str, str]) -> tuple[str, str, Path]:
    """Run the victim's download and swap her claim for a symlink meanwhile; (victim's output, claim, secret)."""
    cache, source, signals = _project(root, label, victim)
    secret = _secret(victim, label)
    started, go = signals / "started", signals / "go"
    proc = victim.popen([sys.executable, "-c", VICTIM, str(source), str(cache), str(started), str(go)], env=env)
    try:
        assert wait_until(lambda: started.exists() or proc.poll() is not None, timeout=120), "download never began"
        assert proc.poll() is None, proc.communicate()
        swap = attacker.python(SWAP, claims.format(cache=cache, proj=cache.parent), str(secret))
        assert swap.returncode == 0, swap.stderr
        go.touch()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    return out.strip(), swap.stdout.strip(), secret


def test_symlink_swapped_for_a_claim_overwrote_the_victims_file_and_no_longer_does(site, before) -> None:
    root, victim, attacker = site
    # Before: the claims were <cache>/.sharedfs/claims/<key>, rewritten in place when the shard was published.
    out, claim, secret = _swap_during_download(root, "before", victim, attacker, "{cache}/.sharedfs/claims/*", before)
    damaged = secret.read_bytes()
    print(f"before: victim's {secret.name} now holds {damaged[:80]!r}")
    assert damaged != SECRET and b'"state": "published"' in damaged  # the victim's own process wrote it
    # Fixed: the claim is changed only through the descriptor that created it, never through a name.
    out, claim, secret = _swap_during_download(root, "fixed", victim, attacker, "{proj}/.cache.sharedfs/claims/*",
                                               {"SHAREDFS_STRICT": "1"})
    assert secret.read_bytes() == SECRET
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert int(out) == (root / "fixed" / "src" / "shard-000000.tar").stat().st_size  # her job got its shard
    assert os.path.islink(claim)  # the planted link is still there, untouched; the next claimer removes it


def _fifo_claim(root: Path, label: str, victim: User, attacker: User, claims: str,
                env: dict[str, str]) -> tuple[int | None, str]:
    """The attacker plants a FIFO as the shard's claim; the victim then opens the shard.  (exit code, stderr)."""
    cache, source, signals = _project(root, label, victim)
    planted = attacker.python(PLANT_FIFO, claims.format(cache=cache, proj=cache.parent), key(source.name))
    assert planted.returncode == 0, planted.stderr
    (signals / "go").touch()  # no pause in the download this time
    proc = victim.popen([sys.executable, "-c", VICTIM, str(source), str(cache), str(signals / "started"),
                         str(signals / "go")], env=env)
    try:
        _, err = proc.communicate(timeout=30)
    except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired: the victim hangs
        proc.kill()
        proc.communicate()
        return None, "hung"
    return proc.returncode, err


def test_fifo_planted_as_a_claim_hung_the_reader_and_no_longer_does(site, before) -> None:
    root, victim, attacker = site
    code, _ = _fifo_claim(root, "fifo-before", victim, attacker, "{cache}/.sharedfs/claims", before)
    assert code is None, "sharedfs before the fix opened the FIFO and waited for a writer forever"
    code, err = _fifo_claim(root, "fifo-fixed", victim, attacker, "{proj}/.cache.sharedfs/claims",
                            {"SHAREDFS_STRICT": "1"})
    assert code == 0, err


# Everything below runs in a private mount namespace whose /tmp is a fresh tmpfs (mode 1777), so
# the scenario uses the real /tmp paths -- wids' fixed default /tmp/_wids_cache and sharedfs's
# node-local root /tmp/sharedfs-<uid> -- without touching this machine's /tmp.
PRIVATE_TMP = textwrap.dedent("""
    import json, os, subprocess, sys
    steps, outer, keep = json.loads(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
    subprocess.run(["mount", "--bind", "/tmp", outer], check=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=1777,size=64m", "tmpfs", "/tmp"], check=True)
    for name in keep:  # what the run itself needs from the real /tmp (a checkout or venv cloned there)
        source, target = os.path.join(outer, name), os.path.join("/tmp", name)
        if os.path.isdir(source):
            os.mkdir(target)
        else:
            open(target, "w").close()
        subprocess.run(["mount", "--bind", source, target], check=True)
    out = []
    for step in steps:
        proc = subprocess.run([sys.executable, "-c", step["code"], *step["args"]], check=False, env=step["env"],
                              user=step["uid"], group=step["gid"], extra_groups=step["groups"], cwd=step["cwd"],
                              capture_output=True, text=True, timeout=300)
        out.append({"code": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr})
    print(json.dumps(out))
""")

# Another user of the node, first: take the victim's node-local root and plant a shard in wids' default cache.
SQUAT = textwrap.dedent("""
    import io, os, sys, tarfile
    from urllib.parse import quote
    victim_uid, url = int(sys.argv[1]), sys.argv[2]
    os.umask(0)
    os.mkdir(f"/tmp/sharedfs-{victim_uid}", 0o777)
    os.mkdir("/tmp/_wids_cache", 0o777)
    with tarfile.open(os.path.join("/tmp/_wids_cache", quote(url, safe="+-")), "w") as tar:  # wids' DefaultLocalname
        for ext, data in (("bin", b"attacker's bytes"), ("txt", b"planted")):
            info = tarfile.TarInfo(f"planted_00000.{ext}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
""")

# The victim's job: a ShardListDataset with wids' default cache (no cache_dir), as wids' README shows.
READ_DEFAULT = textwrap.dedent("""
    import json, sys
    import wids
    ds = wids.ShardListDataset([{"url": sys.argv[1], "nsamples": 1}], transformations=[])
    print(json.dumps({"key": ds[0]["__key__"], "cache": ds.cache_dir}))
""")


def _step(user: User, code: str, args: list[str], env: dict[str, str]) -> dict:
    full = user.env(env)
    for name in ("TMPDIR", "SLURM_TMPDIR", "SLURM_JOB_ID"):  # the node-local root must default to /tmp
        full.pop(name, None)
    return {"code": code, "args": args, "env": full, "uid": user.uid, "gid": user.gid, "groups": [user.group],
            "cwd": str(user.home)}


def test_a_squatted_node_local_root_fails_the_import_instead_of_reading_a_planted_shard(site, before) -> None:
    import json
    import shutil
    import subprocess

    if shutil.which("unshare") is None:
        skip_or_fail("needs unshare (util-linux) for a private /tmp")
    _, victim, attacker = site
    url = "http://127.0.0.1:9/shard-000000.tar"  # never fetched: the planted file is found first
    steps = [_step(attacker, SQUAT, [str(victim.uid), url], {"SHAREDFS_DISABLE": "1"}),
             _step(victim, READ_DEFAULT, [url], {"SHAREDFS_DISABLE": "1"}),  # plain wids
             _step(victim, READ_DEFAULT, [url], before),  # sharedfs before the fix: no SHAREDFS_STRICT, as users run
             _step(victim, READ_DEFAULT, [url], {})]  # this checkout
    # The steps see a fresh /tmp; whatever of the real one this run needs (its venv, the checkout, sharedfs
    # as it was, the users' homes, when they live under /tmp) is bound back in.
    needed = re.findall(r"/tmp/([\w.+-]+)", json.dumps([steps, sys.executable, sys.path]))
    keep = sorted({name for name in needed if not name.startswith("sharedfs-") and name != "_wids_cache"
                   and os.path.lexists(os.path.join("/tmp", name))})
    outer = tempfile.mkdtemp(dir="/var/tmp")
    try:
        proc = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable, "-c", PRIVATE_TMP,
                               json.dumps(steps), outer, json.dumps(keep)],
                              check=False, capture_output=True, text=True, timeout=900, cwd="/")
    finally:
        os.rmdir(outer)
    if proc.returncode != 0 and "unshare failed" in proc.stderr:
        skip_or_fail(f"no private mount namespace here: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr
    squat, plain, old, fixed = json.loads(proc.stdout)
    assert squat["code"] == 0, squat["stderr"]
    # Plain wids reads whatever another user put in the world-shared /tmp/_wids_cache.
    assert plain["code"] == 0 and json.loads(plain["stdout"].splitlines()[-1])["key"] == "planted_00000"
    # sharedfs before: the unsafe node-local root was an "internal error", the shim switched off, and wids
    # fell back to the same planted shard.
    assert old["code"] == 0 and "internal error in shim 'wids'" in old["stderr"], old["stderr"][-2000:]
    assert json.loads(old["stdout"].splitlines()[-1]) == {"key": "planted_00000", "cache": "/tmp/_wids_cache"}
    # Fixed: the import fails closed, naming the directory and its owner; nothing was read.
    print("fixed:", fixed["stderr"].strip().splitlines()[-1])
    assert fixed["code"] != 0 and "planted" not in fixed["stdout"]
    last = fixed["stderr"].strip().splitlines()[-1]
    assert last.startswith("sharedfs.errors.UnsafeDirectoryError:") and f"/tmp/sharedfs-{victim.uid}" in last, last
    assert f"uid {attacker.uid}" in last, last

"""A lock client for the mutual-exclusion tests, run as its own process.

Usage: python mxworker.py LOCKFILE KIND ACTION [ARG]

KIND is a sharedfs kind (``auto``, ``flock``, ``soft``, ...) or ``stock-soft`` / ``stock-flock``
(filelock's own classes, the baseline).  ACTIONS:

``hold``      acquire, print ``held <t>``, hold until stdin closes, print ``released <t>``
``try SECS``  acquire with that timeout; print ``got <t0> <t1>`` or ``timeout <secs> <type>: <msg>``

With ``MX_NFS_MOUNT=<path>`` in the environment, a site plugin (registered the way a
third-party ``sharedfs`` entry point would be) classifies the mount holding that path as an
NFS mount with working lockd: flock and POSIX locks coherent across nodes.  That is what a
healthy NFS client looks like, on a machine without one.  ``MX_NO_MARKER=1`` adds a site rule
that chooses native locks without the existence marker, to reproduce what that marker prevents.
"""

from __future__ import annotations

import os
import sys
import time


def _site_plugin(path: str) -> None:
    from dataclasses import replace

    from sharedfs.machinery import runtime
    from sharedfs.machinery.hookspecs import hookimpl
    from sharedfs.model.fsinfo import FsInfo
    from sharedfs.model.mounts import mount_for

    mount_point = mount_for(path).mount_point

    class HealthyNfs:
        @hookimpl(tryfirst=True)
        def sharedfs_classify_filesystem(self, mount):  # type: ignore[no-untyped-def]
            if mount.mount_point != mount_point:
                return None
            return FsInfo(mount=replace(mount, fstype="nfs4"), kind="nfs", shared=True, flock="coherent",
                          posix="coherent", o_excl_atomic=True, notes=("NFSv4 with working locks (test site).",))

    class NoMarker:
        """A site rule that chooses native locks without the existence marker (what sharedfs 0.1 did)."""

        @hookimpl(tryfirst=True)
        def sharedfs_choose_lock(self, path, fs, policy):  # type: ignore[no-untyped-def]
            from sharedfs.plugins.locking import decide

            return replace(decide(fs, policy), marker=False)

    runtime.registry().pm.register(HealthyNfs(), name="test-site")
    if os.environ.get("MX_NO_MARKER"):
        runtime.registry().pm.register(NoMarker(), name="test-no-marker")


def main() -> None:
    lock_file, kind, action = sys.argv[1:4]
    if os.environ.get("MX_NFS_MOUNT"):
        _site_plugin(os.environ["MX_NFS_MOUNT"])
    if kind.startswith("stock-"):
        import filelock

        lock = (filelock.SoftFileLock if kind == "stock-soft" else filelock.FileLock)(lock_file)
    else:
        import sharedfs

        lock = sharedfs.lock(lock_file, kind=None if kind == "auto" else kind)
    if action == "hold":
        lock.acquire()
        print("held", time.monotonic(), getattr(lock, "kind", kind), flush=True)
        sys.stdin.read()
        released = time.monotonic()
        lock.release()
        print("released", released, flush=True)
        return
    timeout = float(sys.argv[4])
    started = time.monotonic()
    try:
        lock.acquire(timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - the test reads what was raised
        print("timeout", time.monotonic() - started, f"{type(exc).__module__}.{type(exc).__name__}:",
              str(exc).replace("\n", " "), flush=True)
        return
    got = time.monotonic()
    lock.release()
    print("got", started, got, flush=True)


if __name__ == "__main__":
    main()

"""The whole contract between sharedfs and its plugins, in one module (a plugin never patches; a shim never decides).

Every hook is optional; precedence is explicit (``tryfirst``/``trylast``), never registration order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Sequence

import pluggy

if TYPE_CHECKING:  # pragma: no cover - typing only
    from sharedfs.machinery.shimbase import Shim
    from sharedfs.model.fsinfo import FsInfo, Mount
    from sharedfs.model.identity import ProcessIdentity
    from sharedfs.model.policy import CachePlacement, CacheRequest, Layer, LockChoice, Policy, TeamCache
    from sharedfs.model.records import HolderRecord

#: One name for the hook prefix, the pluggy project and the entry-point group.
NAME = "sharedfs"

hookspec = pluggy.HookspecMarker(NAME)
hookimpl = pluggy.HookimplMarker(NAME)

__all__ = [
    "NAME",
    "hookimpl",
    "hookspec",
    "sharedfs_settings_layers",
    "sharedfs_process_identity",
    "sharedfs_classify_filesystem",
    "sharedfs_choose_lock",
    "sharedfs_cache_placement",
    "sharedfs_team_cache",
    "sharedfs_holder_alive",
    "sharedfs_register_shims",
]


@hookspec
def sharedfs_settings_layers(environ: Mapping[str, str]) -> Sequence[Layer]:
    """Contribute layers of raw setting values.

    Called once per policy resolution (at the first target import, on
    ``sharedfs status`` and whenever :func:`sharedfs.policy` is asked with
    explicit arguments).  Layers are merged by ascending ``Layer.priority``;
    the built-in ``settings`` plugin contributes the TOML file (priority 100)
    and the ``SHAREDFS_*`` environment (priority 200); explicit arguments
    always win (priority 1000).  Values are raw (strings from the environment,
    native TOML values); the kernel validates them and raises
    :class:`sharedfs.ConfigError` naming ``Layer.origin`` and the key.

    :param environ: the environment to read (normally ``os.environ``).
    :return: zero or more :class:`sharedfs.Layer` objects.
    """
    raise NotImplementedError  # a specification: pluggy calls the implementations, never this body


@hookspec(firstresult=True)
def sharedfs_process_identity(environ: Mapping[str, str]) -> ProcessIdentity | None:
    """Say who this process is: rank, local rank, world size, node.

    *firstresult*.  Built-in order: an initialised ``torch.distributed``
    (plugin ``distributed``), torchrun's variables, Slurm's ``SLURM_*``
    variables (plugin ``slurm``); when none answers the process is a single
    rank on its own node.  Asked again at each use, never cached: torch.distributed
    may start after the first lock.

    :param environ: the environment to read.
    """


@hookspec(firstresult=True)
def sharedfs_classify_filesystem(mount: Mount) -> FsInfo | None:
    """Classify the filesystem of ``mount`` and say what it can do.

    *firstresult*.  The built-in ``filesystem`` plugin knows Lustre, GPFS, NFS,
    BeeGFS, CephFS, CIFS, FUSE, overlay, tmpfs and local block filesystems;
    it is ``trylast``, so a site plugin's plain ``@hookimpl`` answers first and
    can teach it more (return ``None`` to leave a mount to it).  The answer is
    cached per mount.  An unknown filesystem must be reported as shared with no
    trustworthy lock.

    :param mount: the mount (from ``/proc/self/mountinfo`` and ``statfs``).
    """


@hookspec(firstresult=True)
def sharedfs_choose_lock(path: str, fs: FsInfo, policy: Policy) -> LockChoice | None:
    """Choose the lock kind used for ``path``.

    *firstresult*.  The built-in ``locking`` plugin honours an explicit
    ``policy.lock`` and, under ``auto``, picks the cheapest kind that is
    correct on ``fs``.  A lock that excludes only within one node must never
    be chosen for a path other nodes share.

    :param path: absolute path of the lock file.
    :param fs: the classification of the filesystem holding ``path``.
    :param policy: the policy in force.
    """


@hookspec(firstresult=True)
def sharedfs_cache_placement(request: CacheRequest, policy: Policy) -> CachePlacement | None:
    """Decide where one framework's cache directory goes.

    *firstresult*.  Asked by the kernel once per shim and policy, before the
    shim is applied (the shim receives the answer in its ``ShimContext``).
    The built-in ``cache`` plugin keeps a directory the user chose through the
    framework's own variable, keeps the framework's default under
    ``cache = "shared"``, and returns a private, job-scoped node-local
    directory under ``cache = "node-local"`` -- and under ``auto`` when the
    default is a fixed name in a directory every user can write (wids'
    ``/tmp/_wids_cache``).  Raise :class:`sharedfs.UnsafeDirectoryError` when
    no safe directory can be had: the framework's import then fails with that
    error rather than falling back to the unsafe default.

    :param request: the framework, its cache variable, the user's value of it and its default.
    :param policy: the policy in force.
    """


@hookspec(firstresult=True)
def sharedfs_team_cache(directory: str, policy: Policy) -> TeamCache | None:
    """Say whether ``directory`` is shared by a group of users, and how its files must look.

    *firstresult*.  The built-in ``teamcache`` plugin (``trylast``) answers from the
    ``shared_group`` setting, a setgid directory, or a default ACL granting a group write
    access; ``None`` means a private directory (files keep the creator's umask).  Asked
    once per directory a lock lives in; sharedfs then creates every lock file and marker
    there with the answer's mode and group, whatever the creator's umask.

    :param directory: an existing directory (the nearest existing ancestor of a lock's).
    :param policy: the policy in force.
    """


@hookspec(firstresult=True)
def sharedfs_holder_alive(record: HolderRecord, policy: Policy, unchanged_for: float | None) -> bool | None:
    """Say whether the process that wrote a holder record is still alive.

    The one rule for "holder gone", asked everywhere a record is judged: a lock's
    waiter (may the marker be broken?), the shard cache (may a reader's shard be
    evicted, a download claim be taken over?) and job cleanup (may a job
    directory go?).  *firstresult*.  Return ``True`` (alive: keep waiting),
    ``False`` (gone: its lock may be broken, its files removed) or ``None``
    (cannot tell: nothing is broken or removed).  The built-in answers, in order:
    ``liveness`` (``tryfirst``) judges a lease by ``unchanged_for`` and a holder on
    this node by its pid and process start time; ``slurm`` asks the scheduler
    about holders whose record names a Slurm job; ``liveness``'s last answer
    (``trylast``) lets a shard-cache record nobody can vouch for go after six hours.

    :param record: what the holder wrote (``record.kind`` says what for: a lock
        kind, ``inuse`` or ``downloading`` in a shard cache, ``user`` of a job directory).
    :param policy: the policy in force.
    :param unchanged_for: seconds the caller has watched this record stay
        unchanged (a lock's waiter; what a lease is judged by), or ``None`` when
        it has not watched it.  A plugin written before this argument existed
        simply does not name it.
    """


@hookspec
def sharedfs_register_shims() -> Sequence[Shim]:
    """Return the shims this plugin provides.

    Each shim names its target module, the distribution and versions it
    supports, and implements ``patch``/``unpatch`` (see :class:`sharedfs.machinery.shimbase.Shim`).
    A shim is applied right after its target module has executed.  Block a
    shim by its name with ``SHAREDFS_DISABLE=name``.
    """
    raise NotImplementedError  # a specification: pluggy calls the implementations, never this body


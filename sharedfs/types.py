"""What plugins and shims import from sharedfs: the hook marker, the hooks' types, and the kernel's tools.

Plugins and shims import this module, ``sharedfs`` and ``sharedfs.errors`` only (an import-linter
contract); the modules behind these names are the kernel's own and may move (docs/architecture.md).
"""

from __future__ import annotations

from sharedfs.machinery.hookspecs import hookimpl
from sharedfs.machinery.shimbase import RebindingShim, Shim, ShimContext
from sharedfs.model.fsinfo import FsInfo, Mount
from sharedfs.model.identity import ProcessIdentity
from sharedfs.model.policy import CachePlacement, CacheRequest, Layer, LockChoice, Policy, TeamCache
from sharedfs.model.records import HolderRecord

# The tools a shim builds its patch from, each imported on first use (PEP 562): a shim that never
# takes a lock does not pay for the lock modules.  "module:name" is a name of that module, "module"
# the module itself.
_TOOLS = {
    "conditions": "cluster.conditions",
    "makedirs": "cluster.dirs:makedirs",
    "node_local_dir": "cluster.dirs:node_local_dir",
    "node_local_root": "cluster.dirs:node_local_root",
    "wait_for": "cluster.dirs:wait_for",
    "default_acl_group": "cluster.teamfiles:default_acl_group",
    "refused": "cluster.teamfiles:refused",
    "teamfiles": "cluster.teamfiles",
    "workers": "cluster.workers",
    "Directory": "fs.directory:Directory",
    "lock_by": "fs.oslocks:lock_by",
    "Publication": "fs.publish:Publication",
    "fsync_dir": "fs.publish:fsync_dir",
    "publish": "fs.publish:publish",
    "create_record": "fs.recordfile:create_record",
    "discard_if_same": "fs.recordfile:discard_if_same",
    "identity": "fs.recordfile:identity",
    "NOFOLLOW": "fs.safefile:NOFOLLOW",
    "read_untrusted": "fs.safefile:read_untrusted",
    "stale": "fs.stale",
    "trustedpath": "fs.trustedpath",
    "current_umask": "fs.umask:current_umask",
    "drop_in": "locks:drop_in",
    "lock": "locks:lock",
    "REPORT_AFTER": "locks.reporting:REPORT_AFTER",
    "REPORT_EVERY": "locks.reporting:REPORT_EVERY",
    "FLOCK": "locks.stock:FLOCK",
    "StockLockFile": "locks.stock:StockLockFile",
    "stock_mechanism": "locks.stock:stock_mechanism",
    "SharedFSBaton": "locks.torchbaton:SharedFSBaton",
    "baton_class": "locks.torchbaton:baton_class",
    "build_lock_class": "locks.torchbaton:build_lock_class",
    "torch_lock_class": "locks.torchbaton:torch_lock_class",
    "choices": "machinery.choices",
    "decision": "machinery.log:decision",
    "pending": "machinery.pending",
    "Patcher": "machinery.shimbase:Patcher",
    "unwrap": "machinery.standin:unwrap",
    "envvars": "model.envvars",
    "ABSENT": "model.fsinfo:ABSENT",
    "COHERENT": "model.fsinfo:COHERENT",
    "MAGIC": "model.fsinfo:MAGIC",
    "NODE_LOCAL": "model.fsinfo:NODE_LOCAL",
    "magic_name": "model.fsinfo:magic_name",
    "FuseClient": "model.mounts:FuseClient",
    "fuse_client": "model.mounts:fuse_client",
    "group_name": "model.records:group_name",
    "process_start_time": "model.records:process_start_time",
    "BY_NAME": "model.settings:BY_NAME",
    "MAX_VALUE_CHARS": "model.settings:MAX_VALUE_CHARS",
    "from_environ": "model.settings:from_environ",
    "frozen": "model.structs:frozen",
    "PACKAGES": "modulecache.fill:PACKAGES",
    "ShutilView": "modulecache.fill:ShutilView",
    "fill_once": "modulecache.fill:fill_once",
    "hashing": "modulecache.fill:hashing",
    "verify": "modulecache.verify",
    "NOT_SHARDS": "shardcache:NOT_SHARDS",
    "download_atomic": "shardcache:download_atomic",
    "evict": "shardcache:evict",
    "evictor": "shardcache:evictor",
    "open_shard": "shardcache:open_shard",
    "try_evict": "shardcache:try_evict",
}

MYPY = False  # not typing.TYPE_CHECKING: see sharedfs/__init__.py
if MYPY:  # pragma: no cover
    from sharedfs.cluster import conditions as conditions
    from sharedfs.cluster import teamfiles as teamfiles
    from sharedfs.cluster import workers as workers
    from sharedfs.cluster.dirs import makedirs as makedirs
    from sharedfs.cluster.dirs import node_local_dir as node_local_dir
    from sharedfs.cluster.dirs import node_local_root as node_local_root
    from sharedfs.cluster.dirs import wait_for as wait_for
    from sharedfs.cluster.teamfiles import default_acl_group as default_acl_group
    from sharedfs.cluster.teamfiles import refused as refused
    from sharedfs.fs import stale as stale
    from sharedfs.fs import trustedpath as trustedpath
    from sharedfs.fs.directory import Directory as Directory
    from sharedfs.fs.oslocks import lock_by as lock_by
    from sharedfs.fs.publish import Publication as Publication
    from sharedfs.fs.publish import fsync_dir as fsync_dir
    from sharedfs.fs.publish import publish as publish
    from sharedfs.fs.recordfile import create_record as create_record
    from sharedfs.fs.recordfile import discard_if_same as discard_if_same
    from sharedfs.fs.recordfile import identity as identity
    from sharedfs.fs.safefile import NOFOLLOW as NOFOLLOW
    from sharedfs.fs.safefile import read_untrusted as read_untrusted
    from sharedfs.fs.umask import current_umask as current_umask
    from sharedfs.locks import drop_in as drop_in
    from sharedfs.locks import lock as lock
    from sharedfs.locks.reporting import REPORT_AFTER as REPORT_AFTER
    from sharedfs.locks.reporting import REPORT_EVERY as REPORT_EVERY
    from sharedfs.locks.stock import FLOCK as FLOCK
    from sharedfs.locks.stock import StockLockFile as StockLockFile
    from sharedfs.locks.stock import stock_mechanism as stock_mechanism
    from sharedfs.locks.torchbaton import SharedFSBaton as SharedFSBaton
    from sharedfs.locks.torchbaton import baton_class as baton_class
    from sharedfs.locks.torchbaton import build_lock_class as build_lock_class
    from sharedfs.locks.torchbaton import torch_lock_class as torch_lock_class
    from sharedfs.machinery import choices as choices
    from sharedfs.machinery import pending as pending
    from sharedfs.machinery.log import decision as decision
    from sharedfs.machinery.shimbase import Patcher as Patcher
    from sharedfs.machinery.standin import unwrap as unwrap
    from sharedfs.model import envvars as envvars
    from sharedfs.model.fsinfo import ABSENT as ABSENT
    from sharedfs.model.fsinfo import COHERENT as COHERENT
    from sharedfs.model.fsinfo import MAGIC as MAGIC
    from sharedfs.model.fsinfo import NODE_LOCAL as NODE_LOCAL
    from sharedfs.model.fsinfo import magic_name as magic_name
    from sharedfs.model.mounts import FuseClient as FuseClient
    from sharedfs.model.mounts import fuse_client as fuse_client
    from sharedfs.model.records import group_name as group_name
    from sharedfs.model.records import process_start_time as process_start_time
    from sharedfs.model.settings import BY_NAME as BY_NAME
    from sharedfs.model.settings import MAX_VALUE_CHARS as MAX_VALUE_CHARS
    from sharedfs.model.settings import from_environ as from_environ
    from sharedfs.model.structs import frozen as frozen
    from sharedfs.modulecache import verify as verify
    from sharedfs.modulecache.fill import PACKAGES as PACKAGES
    from sharedfs.modulecache.fill import ShutilView as ShutilView
    from sharedfs.modulecache.fill import fill_once as fill_once
    from sharedfs.modulecache.fill import hashing as hashing
    from sharedfs.shardcache import NOT_SHARDS as NOT_SHARDS
    from sharedfs.shardcache import download_atomic as download_atomic
    from sharedfs.shardcache import evict as evict
    from sharedfs.shardcache import evictor as evictor
    from sharedfs.shardcache import open_shard as open_shard
    from sharedfs.shardcache import try_evict as try_evict

__all__ = [
    "CachePlacement",
    "CacheRequest",
    "FsInfo",
    "HolderRecord",
    "Layer",
    "LockChoice",
    "Mount",
    "Policy",
    "ProcessIdentity",
    "RebindingShim",
    "Shim",
    "ShimContext",
    "TeamCache",
    "hookimpl",
    *_TOOLS,
]


def __getattr__(name: str) -> object:
    where = _TOOLS.get(name)
    if where is None:
        raise AttributeError(f"module 'sharedfs.types' has no attribute {name!r}")
    from importlib import import_module

    module, _, attribute = where.partition(":")
    found = import_module(f"sharedfs.{module}")
    value = getattr(found, attribute) if attribute else found
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

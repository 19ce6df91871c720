"""torch.hub: a checkpoint (``load_state_dict_from_url``) and a repository (``load``) are fetched once per cache.

Stock fetches from every rank at once, and one rank removes the zip another reads (pytorch#68320).
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from types import ModuleType
from typing import Any, Callable

from sharedfs.types import Directory, Policy, Shim, ShimContext, hookimpl, lock, unwrap, wait_for


class _Inside(threading.local):
    depth = 0  # nested load_state_dict_from_url calls of this thread


_inside = _Inside()


def loading(original: Callable[..., Any]) -> Callable[..., Any]:
    """``load_state_dict_from_url``, marking its thread as inside it (its downloads go through the lock)."""

    @functools.wraps(original)
    def load_state_dict_from_url(*args: Any, **kwargs: Any) -> Any:
        _inside.depth += 1
        try:
            return original(*args, **kwargs)
        finally:
            _inside.depth -= 1

    return load_state_dict_from_url


def downloading_once(original: Callable[..., Any], policy: Policy) -> Callable[..., Any]:
    """``download_url_to_file`` that, inside ``load_state_dict_from_url``, downloads only what no other rank has."""

    @functools.wraps(original)
    def download_url_to_file(url: str, dst: str, hash_prefix: str | None = None, progress: bool = True) -> None:
        if not _inside.depth:
            return original(url, dst, hash_prefix, progress)
        directory, name = os.path.split(os.path.abspath(dst))
        with lock(os.path.join(directory, f".{name}.lock"), policy=policy):
            if os.path.exists(dst):
                return None  # another rank downloaded it while this one waited
            return original(url, dst, hash_prefix, progress)

    return download_url_to_file


class _Fetching(threading.local):
    held: contextlib.ExitStack | None = None  # the lock of the _get_cache_or_reload call this thread is in


_fetching = _Fetching()


def fetching_once(original: Callable[..., Any]) -> Callable[..., Any]:
    """``_get_cache_or_reload``, releasing the repository's lock (taken by the trust check) when it returns."""

    @functools.wraps(original)
    def _get_cache_or_reload(*args: Any, **kwargs: Any) -> Any:
        outer = _fetching.held
        with contextlib.ExitStack() as held:
            _fetching.held = held
            try:
                return original(*args, **kwargs)
            finally:
                _fetching.held = outer

    return _get_cache_or_reload


def trusting(original: Callable[..., Any], hub: ModuleType, policy: Policy) -> Callable[..., Any]:
    """``_check_repo_is_trusted``, then (inside ``_get_cache_or_reload``) the lock on the repository's folder.

    torch calls it with ``owner_name_branch`` (the folder's name) right before it looks for the
    cached folder: everything from that look to the move into place then runs under the lock.
    """

    @functools.wraps(original)
    def _check_repo_is_trusted(repo_owner: str, repo_name: str, owner_name_branch: str,
                               *args: Any, **kwargs: Any) -> Any:
        result = original(repo_owner, repo_name, owner_name_branch, *args, **kwargs)
        held, _fetching.held = _fetching.held, None  # one lock per _get_cache_or_reload call
        if held is not None:
            hub_dir = hub.get_dir()
            held.enter_context(lock(os.path.join(hub_dir, f".{owner_name_branch}.lock"), policy=policy))
            see_published(hub_dir, owner_name_branch, policy)
        return result

    return _check_repo_is_trusted


def see_published(hub_dir: str, name: str, policy: Policy) -> None:
    """Under the lock, before torch's ``os.path.exists``: make this node see ``<hub_dir>/<name>`` if it exists.

    A folder a rank on another node published just before releasing the lock may still be "missing" in this
    node's metadata cache (NFS's negative lookups): torch would download it again and move its copy onto
    the folder that is there.  Listing the directory revalidates it on NFS; where that is not enough, a
    ``mkdir`` asks the server itself -- EEXIST: it is there, wait until this node sees it (torch then uses
    it); created: nobody published it, so the empty probe is removed again and torch downloads.  Only lock
    holders publish there, so nothing else appears meanwhile.
    """
    path = os.path.join(hub_dir, name)
    os.listdir(hub_dir)
    if os.path.lexists(path):
        return
    with Directory.open(hub_dir) as where:
        try:
            # Seen for a moment by a process without sharedfs as an empty folder; the trust check of another
            # rank may count it, but this one's trust check has passed: the repository is trusted in this hub.
            os.mkdir(name, 0o700, dir_fd=where.fd)
        except FileExistsError:
            wait_for(path, policy.wait_timeout, what=f"torch.hub repository {path}, published by another process")
            return
        except OSError:
            return  # a hub nobody may write to, say: torch's own download fails as it would without sharedfs
        # Relative to the directory held open, and rmdir removes only an empty directory: never anything else.
        os.rmdir(name, dir_fd=where.fd)


class TorchHubShim(Shim):
    name = "torch_hub"
    distribution = "torch"
    # load_state_dict_from_url checks os.path.exists and calls the module's download_url_to_file(url, dst,
    # hash_prefix, progress) in every release from 2.1; _get_cache_or_reload calls the module's
    # _check_repo_is_trusted(repo_owner, repo_name, owner_name_branch, ...) right before its os.path.exists
    # look for the folder (older releases pass a calling_fn too: the wrappers pass every argument through).
    # Read in 2.13.0 and 2.15.0 (hub.py differs only in a docstring), tested with both.
    supported = ">=2.1,<3"

    def apply(self, module: ModuleType, policy: Policy, context: ShimContext) -> None:
        self.patcher.setattr(module, "download_url_to_file", downloading_once(module.download_url_to_file, policy))
        # The bootstrap's stand-ins may still stand there (the first call of one is activating us): wrap the originals.
        self.patcher.setattr(module, "load_state_dict_from_url", loading(unwrap(module.load_state_dict_from_url)))
        self.patcher.setattr(module, "_check_repo_is_trusted", trusting(module._check_repo_is_trusted, module, policy))
        self.patcher.setattr(module, "_get_cache_or_reload", fetching_once(unwrap(module._get_cache_or_reload)))


@hookimpl
def sharedfs_register_shims() -> list[Shim]:
    return [TorchHubShim()]

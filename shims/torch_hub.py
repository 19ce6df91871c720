"""torch.hub: ``load_state_dict_from_url`` downloads a checkpoint once per cache, not once per rank.

Every rank of a job calls ``torch.hub.load_state_dict_from_url(url)`` (torchvision's
``weights=...``, timm, many training scripts) for the same checkpoint into one
``$TORCH_HOME/hub/checkpoints``.  Each rank that finds the file missing downloads it --
``download_url_to_file`` writes a temporary ``.partial`` file of its own and moves it into
place, so the file is whole, but N ranks fetch N copies from the network at once (the issue
pytorch#68320 tracks for ``torch.hub``).

The shim wraps ``load_state_dict_from_url`` and gives the ``download_url_to_file`` it calls a
:func:`sharedfs.lock` on ``<model_dir>/.<file>.lock``: the first rank downloads, the others wait
on that lock, then find the file and download nothing.  Everything else -- the progress bar,
``check_hash``, the legacy zip format, ``torch.load`` -- is torch's own.  A direct call of
``torch.hub.download_url_to_file`` (which overwrites its destination on purpose) is left as it is.
"""

from __future__ import annotations

import functools
import os
import threading
from types import ModuleType
from typing import Any, Callable

from sharedfs.locks import lock
from sharedfs.machinery.standin import unwrap
from sharedfs.types import Policy, Shim, ShimContext, hookimpl


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


class TorchHubShim(Shim):
    name = "torch_hub"
    # Imported by `import torch`: the bootstrap puts a stand-in for load_state_dict_from_url there (STAND_INS), so
    # `import torch` loads nothing of sharedfs; its first call activates this shim.
    target = "torch.hub"
    distribution = "torch"
    # load_state_dict_from_url checks os.path.exists and calls the module's download_url_to_file(url, dst,
    # hash_prefix, progress) in every release from 2.1; read in 2.13.0, tested with 2.13.0.
    supported = ">=2.1,<3"

    def apply(self, module: ModuleType, policy: Policy, context: ShimContext) -> None:
        self.patcher.setattr(module, "download_url_to_file", downloading_once(module.download_url_to_file, policy))
        # The bootstrap's stand-in may still stand there (its first call is activating us): wrap the original.
        self.patcher.setattr(module, "load_state_dict_from_url", loading(unwrap(module.load_state_dict_from_url)))


@hookimpl
def sharedfs_register_shims() -> list[Shim]:
    return [TorchHubShim()]

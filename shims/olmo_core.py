"""OLMo-core: waits for a directory another rank made get sharedfs's budget; one creator per shared filesystem.

OLMo-core's fixed 10 s ``wait_for`` is shorter than NFS's metadata lag (OLMo#829; docs/frameworks/olmo.md).
"""

from __future__ import annotations

import functools
import os
from types import ModuleType
from typing import Any, Callable

from sharedfs.errors import WaitTimeout
from sharedfs.types import Patcher, Policy, RebindingShim, Shim, ShimContext, decision, hookimpl

#: Written for and tested with ai2-olmo-core 3.0.0 (``wait_for``, ``_prepare_env_for_save`` and
#: ``Checkpointer._prepare_dir`` have this shape throughout 3.x).
SUPPORTED = ">=3.0,<4"
DISTRIBUTION = "ai2-olmo-core"
#: OLMo-core's own variable (``olmo_core.distributed.utils.OLMO_SHARED_FS_ENV_VAR``).
SHARED_FS_VAR = "OLMO_SHARED_FS"


class OlmoCoreShim(RebindingShim):
    name = "olmo_core"
    distribution = DISTRIBUTION
    supported = SUPPORTED
    # Bound by name in olmo_core.distributed.checkpoint, train.checkpoint and train.callbacks.checkpointer,
    # normally after olmo_core.utils was patched (it is imported first).
    function = "wait_for"
    package = "olmo_core"

    def replacement(self, original: Callable[..., Any], policy: Policy) -> Callable[..., None]:
        return make_wait_for(original, policy)


class OlmoCoreCheckpointShim(Shim):
    """``_prepare_env_for_save(dir, ...)``: the directory every ``save_*`` entry point prepares."""

    name = "olmo_core.checkpoint"
    distribution = DISTRIBUTION
    supported = SUPPORTED

    def apply(self, module: ModuleType, policy: Policy, context: ShimContext) -> None:
        # save_state_dict and save_model_and_optim_state (and their async forms) look it up in the module.
        self.patcher.setattr(module, "_prepare_env_for_save",
                             sharing_first(module._prepare_env_for_save, self.patcher))


class OlmoCoreTrainShim(Shim):
    """``Checkpointer._prepare_dir(dir, ...)``: the trainer does not go through ``_prepare_env_for_save``."""

    name = "olmo_core.train"
    distribution = DISTRIBUTION
    supported = SUPPORTED

    def apply(self, module: ModuleType, policy: Policy, context: ShimContext) -> None:
        checkpointer = module.Checkpointer
        original = checkpointer._prepare_dir
        patcher = self.patcher

        @functools.wraps(original)
        def _prepare_dir(self: Any, dir: Any, *args: Any, **kwargs: Any) -> Any:
            share_filesystem(dir, patcher)
            return original(self, dir, *args, **kwargs)

        self.patcher.setattr(checkpointer, "_prepare_dir", _prepare_dir)


def make_wait_for(original: Callable[..., Any], policy: Policy) -> Callable[..., None]:
    budget_floor = policy.wait_timeout

    @functools.wraps(original)
    def wait_for(condition: Callable[[], bool], description: str, timeout: float = 10.0) -> None:
        """sharedfs: OLMo-core's ``wait_for`` with a budget of ``max(timeout, SHAREDFS_WAIT_TIMEOUT)``.

        One waiter per node looks when ``condition`` is a path's own check, and the ``TimeoutError``
        names the path, the node, the filesystem and the setting (OLMo#829).
        """
        from sharedfs.types import conditions

        try:
            conditions.wait(condition, max(float(timeout), budget_floor), what=str(description))
        except WaitTimeout as exc:
            # OLMo-core's message first (what its users and logs grep for), then ours.
            raise WaitTimeout(f"timed out {description}: {exc}") from None

    return wait_for


def share_filesystem(directory: Any, patcher: Patcher) -> None:
    """Set ``OLMO_SHARED_FS=1`` when ``directory`` (a checkpoint directory) is on a shared filesystem.

    The one place this shim decides it.  Why: OLMo-core's ``get_fs_local_rank`` otherwise makes
    each node's local rank 0 create and clear the same shared directory, and a node whose
    cache still hides the first ``mkdir`` gets ``FileExistsError`` (the lagging-cache state of
    OLMo#829).  A value the user set (``1``, ``0`` or anything else) is never overridden, and
    URLs (object stores) are left alone.  Every rank classifies the same mount, so all agree.
    """
    if SHARED_FS_VAR in os.environ:
        return
    text = os.fspath(directory) if isinstance(directory, os.PathLike) else str(directory)
    if "://" in text:
        return
    from sharedfs.types import choices

    path = os.path.abspath(text)
    try:
        fs = choices.filesystem(path)
    except OSError:
        return  # cannot tell: OLMo-core's own default stands
    if not fs.shared:
        return
    patcher.setitem(os.environ, SHARED_FS_VAR, "1")
    decision(f"{SHARED_FS_VAR}=1 for this process: checkpoint directory {path} is on {fs.kind} "
             f"({fs.mount.fstype} {fs.mount.mount_point}), shared by every node, so one rank creates it "
             f"instead of one per node (set {SHARED_FS_VAR} yourself to choose otherwise)")


def sharing_first(original: Callable[..., Any], patcher: Patcher) -> Callable[..., Any]:
    """``original(dir, ...)``, after :func:`share_filesystem` has looked at ``dir``."""

    @functools.wraps(original)
    def prepare(dir: Any, *args: Any, **kwargs: Any) -> Any:
        share_filesystem(dir, patcher)
        return original(dir, *args, **kwargs)

    return prepare


@hookimpl
def sharedfs_register_shims() -> list[Shim]:
    return [OlmoCoreShim(), OlmoCoreCheckpointShim(), OlmoCoreTrainShim()]

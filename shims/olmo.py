"""OLMo (``ai2-olmo``): waits for a checkpoint directory another rank made get sharedfs's budget.

``olmo.util.wait_for(condition, description, timeout=10.0)`` polls every 0.5 s and
raises ``TimeoutError("... timed out")`` after a fixed 10 s.  ``olmo.checkpoint``
(which binds it by name) calls it on every rank with ``lambda:
checkpoint_dir.exists()`` after rank 0 made the directory; on NFS and Lustre,
attribute and negative-lookup caches hide it from other nodes for longer and
those ranks die (OLMo#829).

The shim replaces ``wait_for`` in ``olmo.util`` and in every ``olmo`` module that
bound it already: the budget is ``max(timeout, SHAREDFS_WAIT_TIMEOUT)``; a
condition that is a path's own check (the lambda's one free variable holds the
``Path``) is waited for as that path (:mod:`sharedfs.cluster.conditions`: one
waiter per node looks, the parent is re-listed), anything else as a predicate;
the ``TimeoutError`` keeps OLMo's message and adds where, on what and what to change.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from sharedfs.errors import WaitTimeout
from sharedfs.types import Policy, RebindingShim, Shim, hookimpl


class OlmoShim(RebindingShim):
    name = "olmo"
    target = "olmo.util"
    distribution = "ai2-olmo"
    #: Written for ai2-olmo 0.6.0's ``olmo.util.wait_for`` (the same since 0.3).
    supported = ">=0.6,<0.7"
    function = "wait_for"  # olmo.checkpoint binds it by name
    package = "olmo"

    def replacement(self, original: Callable[..., Any], policy: Policy) -> Callable[..., None]:
        return make_wait_for(original, policy)


def make_wait_for(original: Callable[..., Any], policy: Policy) -> Callable[..., None]:
    budget_floor = policy.wait_timeout

    @functools.wraps(original)
    def wait_for(condition: Callable[[], bool], description: str, timeout: float = 10.0) -> None:
        """sharedfs: OLMo's ``wait_for`` with a budget of ``max(timeout, SHAREDFS_WAIT_TIMEOUT)`` (OLMo#829)."""
        from sharedfs.cluster import conditions

        try:
            conditions.wait(condition, max(float(timeout), budget_floor), what=str(description))
        except WaitTimeout as exc:
            raise WaitTimeout(f"{description} timed out: {exc}") from None

    return wait_for


@hookimpl
def sharedfs_register_shims() -> list[Shim]:
    return [OlmoShim()]

"""OLMo (``ai2-olmo``): waits for a checkpoint directory another rank made get sharedfs's budget.

OLMo's fixed 10 s ``wait_for`` is shorter than NFS's metadata lag (OLMo#829; docs/frameworks/olmo.md).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from sharedfs.errors import WaitTimeout
from sharedfs.types import Policy, RebindingShim, Shim, hookimpl


class OlmoShim(RebindingShim):
    name = "olmo"
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
        from sharedfs.types import conditions

        try:
            conditions.wait(condition, max(float(timeout), budget_floor), what=str(description))
        except WaitTimeout as exc:
            raise WaitTimeout(f"{description} timed out: {exc}") from None

    return wait_for


@hookimpl
def sharedfs_register_shims() -> list[Shim]:
    return [OlmoShim()]

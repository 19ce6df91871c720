"""pytest fixtures ``realfs_kind`` (every kind, or narrowed with ``indirect=True``) and ``real_volume`` (torn down after the test).

A kind that cannot run here is skipped with its install command, or fails under ``$CI`` where its packages install.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Callable, Iterator

import pytest

from harness.skips import skip_or_fail
from sharedfs.demo.realfs import KINDS, RealFSUnavailable, Volume, installable, unavailable, volume

__all__ = ["real_volume", "realfs_kind", "require_realfs"]


def require_realfs(kind: str) -> None:
    """Skip (or under CI, fail) the test unless ``kind`` can run here."""
    reason = unavailable(kind)
    if reason is None:
        return
    if installable(kind):
        skip_or_fail(reason)
    pytest.skip(f"{reason} (this system's package manager does not offer it)")


@pytest.fixture(params=KINDS)
def realfs_kind(request: pytest.FixtureRequest) -> str:
    """Each real filesystem kind in turn, skipped (failed under CI) where it cannot run."""
    kind = str(request.param)
    require_realfs(kind)
    return kind


@pytest.fixture
def real_volume(realfs_kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., Volume]]:
    """Factory: ``real_volume(profile="default", nodes=2, node_local_locks=False) -> Volume`` of ``realfs_kind``.

    Every volume is torn down at teardown; its start and stop seconds go to the test's
    ``user_properties`` (``realfs:<kind>:<profile>``) for reports.
    """
    with ExitStack() as stack:
        started: list[Volume] = []

        def factory(profile: str = "default", nodes: int = 2, node_local_locks: bool = False) -> Volume:
            try:
                vol = stack.enter_context(volume(realfs_kind, nodes=nodes, profile=profile, workdir=tmp_path,
                                                       node_local_locks=node_local_locks))
            except RealFSUnavailable as exc:
                skip_or_fail(str(exc))
            started.append(vol)
            return vol

        try:
            yield factory
        finally:
            stack.close()
            for vol in started:
                request.node.user_properties.append((f"realfs:{vol.kind}:{vol.profile}", dict(vol.timings)))

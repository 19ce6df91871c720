"""pytest fixtures: ``hostile_mount`` (hostilefs under ``tmp_path``), ``fault_preload`` and ``slurm_cluster``.

Where FUSE or a C compiler is missing the test is skipped with the reason, or fails under ``$CI`` (:mod:`harness.skips`).
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterable, Iterator, List, Optional, Union

import pytest

from harness.skips import skip_or_fail
from harness.slurm import SlurmCluster, SlurmUnavailable, slurm_available, start
from sharedfs.demo.hostilefs import FuseUnavailable, HostileMount, fuse_available, mount
from sharedfs.demo.preload import PreloadUnavailable, preload_env

__all__ = ["fault_preload", "hostile_mount", "skip_or_fail", "slurm_cluster"]


@pytest.fixture
def hostile_mount(tmp_path: Path) -> Iterator[Callable[..., HostileMount]]:
    """Factory: ``hostile_mount("localflock", lag_ms=1000, latency_ms=0) -> HostileMount``.

    Each call mounts a fresh backing dir under ``tmp_path``; all mounts are
    unmounted at teardown, also when the test fails.
    """
    mounts: List[HostileMount] = []
    counter = itertools.count()

    def factory(profile: str = "plain", *, lag_ms: float = 2000, latency_ms: float = 0,
                timeout: float = 10.0, flush_ms: float = 0) -> HostileMount:
        ok, reason = fuse_available()
        if not ok:
            skip_or_fail(f"FUSE unavailable: {reason}")
        base = tmp_path / f"hostilefs-{next(counter)}-{profile.replace('+', '_')}"
        try:
            m = mount(base / "backing", base / "mnt", profile, lag_ms=lag_ms,
                      latency_ms=latency_ms, timeout=timeout, flush_ms=flush_ms)
        except FuseUnavailable as exc:
            skip_or_fail(f"FUSE unavailable: {exc}")
        mounts.append(m)
        return m

    try:
        yield factory
    finally:
        for m in reversed(mounts):
            m.unmount()


@pytest.fixture
def fault_preload() -> Callable[..., dict]:
    """Factory: ``fault_preload(prefixes, errno_name="ENOSYS", base=None) -> env dict``."""

    def factory(prefixes: Union[str, "os.PathLike[str]", Iterable[Union[str, "os.PathLike[str]"]]],
                errno_name: Union[str, int] = "ENOSYS", base: Optional[dict] = None) -> dict:
        try:
            return preload_env(prefixes, errno_name, base)
        except PreloadUnavailable as exc:
            skip_or_fail(f"lock fault library unavailable: {exc}")

    return factory


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """A 2-node test Slurm cluster (``n1``, ``n2``, 4 CPUs each) for the whole session.

    Its epilog runs ``<root>/epilog.d/*`` (tests drop scripts there).  Skips
    with the reason when Slurm cannot run here -- fails instead under ``CI``.
    """
    ok, reason = slurm_available()
    if not ok:
        skip_or_fail(f"no test Slurm cluster: {reason}")
    # Short root: munge's socket path must fit in a sockaddr_un (108 bytes).
    root = Path(tempfile.mkdtemp(prefix="sfslurm-"))
    epilog = root / "epilog.sh"
    (root / "epilog.d").mkdir()
    epilog.write_text("#!/bin/sh\n# run every test-provided epilog hook; never fail the node\n"
                      f'for hook in "{root}/epilog.d/"*; do [ -x "$hook" ] && "$hook"; done\nexit 0\n')
    epilog.chmod(0o755)
    try:
        cluster = start(root, nodes=2, cpus=4, epilog=str(epilog))
    except SlurmUnavailable as exc:
        skip_or_fail(str(exc))
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)

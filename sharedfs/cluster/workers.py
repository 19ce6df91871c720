"""Cap DataLoader ``num_workers`` to the CPUs this task may use, for the datasets a shim claims."""

from __future__ import annotations

import logging
import math
import os
from typing import Any, Callable

from sharedfs.machinery.log import decision

#: shim name -> "is this dataset one of yours?"  Shims add and remove entries through
#: their Patcher, so unpatching a shim also withdraws its predicate.
PREDICATES: dict[str, Callable[[Any], bool]] = {}


def cpu_budget(environ: Any = os.environ) -> tuple[int, str] | None:
    """The number of CPUs this task may use and why, or None when nothing limits it."""
    limits: list[tuple[int, str]] = []
    try:
        affinity = len(os.sched_getaffinity(0))
        limits.append((affinity, f"CPU affinity allows {affinity} CPU(s) (os.sched_getaffinity)"))
    except (AttributeError, OSError):
        pass
    slurm = environ.get("SLURM_CPUS_PER_TASK", "").strip()
    if slurm.isdigit() and int(slurm) > 0:
        limits.append((int(slurm), f"SLURM_CPUS_PER_TASK={slurm}"))
    quota = _cgroup_quota()
    if quota is not None:
        limits.append(quota)
    if not limits:
        return None
    return min(limits, key=lambda item: item[0])


def _cgroup_quota() -> tuple[int, str] | None:
    # cgroup v2: "max 100000" (no quota) or "200000 100000" (2 CPUs)
    try:
        with open("/sys/fs/cgroup/cpu.max", encoding="ascii") as fh:
            quota, period = fh.read().split()[:2]
        if quota != "max":
            cpus = max(1, math.ceil(int(quota) / int(period)))
            return cpus, f"cgroup CPU quota allows {cpus} CPU(s) (cpu.max {quota} {period})"
    except (OSError, ValueError):
        pass
    try:  # cgroup v1
        with open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", encoding="ascii") as fh:
            quota_us = int(fh.read())
        with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us", encoding="ascii") as fh:
            period_us = int(fh.read())
        if quota_us > 0 and period_us > 0:
            cpus = max(1, math.ceil(quota_us / period_us))
            return cpus, f"cgroup CPU quota allows {cpus} CPU(s) (cpu.cfs_quota_us {quota_us})"
    except (OSError, ValueError):
        pass
    return None


def worker_cap(max_workers: int | str, environ: Any = os.environ) -> tuple[int, str] | None:
    """``(cap, reason)`` for the ``max_workers`` setting, or None for no cap."""
    if max_workers == "off":
        return None
    if isinstance(max_workers, int):
        return max_workers, f"SHAREDFS_MAX_WORKERS={max_workers}"
    return cpu_budget(environ)


def capped(asked: int, framework: str, max_workers: int | str) -> int:
    """The ``num_workers`` to use instead of ``asked`` under the ``max_workers`` setting; logs once when it differs."""
    cap = worker_cap(max_workers)
    if cap is None or asked <= cap[0]:
        return asked
    used, why = cap
    decision(f"DataLoader over a {framework} dataset: num_workers={asked} asked, {used} used: {why} "
             f"(set SHAREDFS_MAX_WORKERS=off to keep {asked}, or an integer to choose)",
             level=logging.WARNING)
    return used


def owner(dataset: Any) -> str | None:
    """The shim whose framework made ``dataset``, or ``None`` (then its DataLoader is left alone)."""
    for name, predicate in list(PREDICATES.items()):
        try:
            if predicate(dataset):
                return name
        except Exception:  # noqa: BLE001 - a predicate must never break a DataLoader
            continue
    return None

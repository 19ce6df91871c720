"""Scenarios of metadata that lags between nodes: the makedirs race and OLMo's visibility timeout."""

from __future__ import annotations

from pathlib import Path

from .sim import Outcome, ScenarioSkipped, Sim


def makedirs_race(sim: Sim) -> tuple[Outcome, Outcome]:
    """lingua's makedirs and torch DCP's save, unchanged, from 6 ranks on 3 nodes: without sharedfs, then with it.

    The programs make no ``sharedfs.`` call (:mod:`sharedfs.demo.scenario_makedirs`): sharedfs's
    ``makedirs`` shim is what changes between the two runs.
    """
    from sharedfs.demo import scenario_makedirs

    mounts: list[Path] | None = None
    if sim.real:  # each node's ranks go through that node's own client mount
        mounts = sim.node_dirs()
        path, env = mounts[0], dict(sim.base_env)
    else:
        path, env = sim.shared_dir("lagging", lag_ms=3000)
    outcomes = []
    for run, extra in (("run-without", {"SHAREDFS_DISABLE": "1"}), ("run-with", {})):
        results = scenario_makedirs.run_ranks(path, run, {**env, **extra}, mounts=mounts)
        tally = scenario_makedirs.tally(results)
        failures = sum(len(results) - ok for ok, _ in tally.values())
        steps = len(results) * len(tally)
        first = next((failure for _, failure in tally.values() if failure), "")
        if failures:
            cause = f"{failures} of {steps} rank-steps failed; the first: {first[:120]}"
        else:  # what a real FUSE client here does: EEXIST is not followed by "not a directory"
            cause = f"not reproduced on {sim.fs}: its client does not show it (0 of {steps} rank-steps failed)"
        outcomes.append(Outcome(failures > 0, scenario_makedirs.evidence(results), cause=cause))
    return outcomes[0], outcomes[1]


#: Longer than OLMo-core's fixed 10 s wait: what NFS attribute and negative-lookup caches do to a new directory.
OLMO_CORE_LAG_MS = 13_000


def visibility_timeout(sim: Sim) -> tuple[Outcome, Outcome]:
    """OLMo#829 with OLMo-core itself: 4 ranks on 2 nodes call ``save_state_dict``, unchanged, in its own venv."""
    from sharedfs.demo.frameworkvenv import VenvBuildError, install_sharedfs, python_of, source_checkout
    from sharedfs.demo.olmo_core_job import REQUIREMENTS, olmo_core_venv, start_job, summary

    try:
        root = olmo_core_venv(note=sim.note)
        install_sharedfs(root, source_checkout())  # from a wheel's installation: its files are copied
    except VenvBuildError as exc:
        raise ScenarioSkipped(f"could not build the OLMo-core 3.0.0 venv ({str(exc).splitlines()[-1][:120]}); "
                              f"it needs the packages pinned in {REQUIREMENTS.name} from your package index") from None
    path, env = sim.shared_dir("lagging", lag_ms=OLMO_CORE_LAG_MS)
    env = {k: v for k, v in env.items() if not k.startswith(("SHAREDFS_", "PYTHON"))}
    # Both jobs at once, each in its own directory of the one mount (the lag is per entry): the demo waits for
    # the slower one instead of both.
    jobs = [start_job(python_of(root), path / f"checkpoint-{name}", {**env, **extra},
                      local_root=sim.work / f"olmo-core-nodes-{name}", nodes=2, per_node=2)
            for name, extra in (("without", {"SHAREDFS_DISABLE": "1"}), ("sharedfs", {}))]
    outcomes = []
    for job in jobs:
        reports = job.reports(timeout=120)
        saved = all(r["ok"] for r in reports)
        timeouts = [r["error"] for r in reports if str(r["error"]).startswith("TimeoutError")]
        evidence = summary(reports)
        if timeouts:
            evidence += f": {timeouts[0][:120]}"
        elif saved:
            slowest = max(r["seconds"] for r in reports)
            evidence += f", the last after {slowest:.0f} s ({OLMO_CORE_LAG_MS // 1000} s lag)"
        outcomes.append(Outcome(not saved, evidence))
    return outcomes[0], outcomes[1]

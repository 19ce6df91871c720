"""Scenarios of shards read by several nodes: wids and webdataset from a local HTTP server, Triton's cache."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sharedfs.demo.shardserver import ShardServer

from .sim import Outcome, Sim, last_error

SHARDS, SHARD_SAMPLES = 4, 10


def _shard_server(sim: Sim, delay: float) -> tuple[ShardServer, list[str], dict[str, str]]:
    """A fresh :class:`ShardServer` (closed by ``sim.stack``), its shard URLs, and the expected samples."""
    from sharedfs.demo.shardserver import ShardServer, make_shards

    root = sim.work / "shards"
    expected = make_shards(root, count=SHARDS, samples=SHARD_SAMPLES)  # deterministic: rewriting is harmless
    server = sim.stack.enter_context(ShardServer(root, delay=delay, max_seconds=120))
    return server, server.urls(server.shard_names()), expected


def _readers(sim: Sim, code: str, args: list[str], env: dict[str, str], nodes: int, count: int,
             timeout: float = 90) -> list[subprocess.CompletedProcess[str]]:
    """``count`` reader processes over ``nodes`` simulated nodes, released together by a gate."""
    sim.counter += 1
    gate = str(sim.work / f"gate{sim.counter}")
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args, gate],
                              env={**env, "SHAREDFS_NODE_ID": f"node{i % nodes}", "SHAREDFS_TEST_INDEX": str(i),
                                   "SHAREDFS_TEST_COUNT": str(count)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(count)]
    done = []
    try:
        for proc in procs:
            try:
                out, err = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
                err += f"\nhung: killed after {timeout:.0f} s"
            done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    finally:  # Ctrl-C or an error: no reader outlives the demo
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return done


def _samples(proc: subprocess.CompletedProcess[str]) -> dict[str, str] | None:
    if proc.returncode:
        return None
    try:  # wids prints cache-miss warnings to stdout: the result is the last line
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return None


WIDS_READER = """
    import json, sys
    from sharedfs.demo.shardserver import sample_digest, start_together
    import wids
    urls, cache, samples, gate = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    start_together(gate)  # before wids touches the cache: a failing reader must not strand the others
    ds = wids.ShardListDataset([{"url": u, "nsamples": samples} for u in urls], cache_dir=cache,
                               transformations=[])
    got = {}
    for i in range(len(ds)):
        s = ds[i]
        data = s[".bin"]
        data = data.read() if hasattr(data, "read") else bytes(data)
        got[s["__key__"]] = sample_digest(s["__key__"], data)
    print(json.dumps(got))
"""


def triton_cache(sim: Sim) -> tuple[Outcome, Outcome]:
    """Triton's kernel cache filled by 9 processes on 3 nodes through its own API (triton#2688).

    The programs make no ``sharedfs.`` call (:mod:`sharedfs.demo.scenario_triton`).
    """
    from sharedfs.demo import scenario_triton

    if sim.real:
        mounts = sim.node_dirs()
        path, env = mounts[0], dict(sim.base_env)
    else:
        path, env = sim.shared_dir("lagging", lag_ms=2000)
        mounts = [path] * 3
    outcomes = []
    for label, extra in (("without", {"SHAREDFS_DISABLE": "1"}), ("with", {})):
        node_dirs = {f"n{i}": str(mounts[i] / f"cache-{label}") for i in range(3)}
        reports = scenario_triton.run(path / f"cache-{label}", {"n0": 3, "n1": 3, "n2": 3}, {**env, **extra},
                                      node_dirs=node_dirs)
        failed = scenario_triton.failed(reports)
        evidence = f"{len(reports) - failed}/{len(reports)} processes compiled or loaded all 6 kernels"
        errors = scenario_triton.first_errors(reports)
        if errors:
            first = errors[0].split(": ", 1)[1]
            for mnt in {*mounts, path}:
                first = first.replace(str(mnt), "...")
            evidence += "; " + first
            cause = f"{failed} of {len(reports)} processes failed; the first: {first[:120]}"
        else:
            cause = f"not reproduced on {sim.fs}: 0 of {len(reports)} processes failed" if sim.real else ""
        outcomes.append(Outcome(failed > 0, evidence, cause=cause))
    return outcomes[0], outcomes[1]


def wids_flockless(sim: Sim) -> tuple[Outcome, Outcome]:
    """webdataset#386: wids' ULockFile flocks ``<shard>.tar.lock`` in the cache dir."""
    server, urls, expected = _shard_server(sim, delay=0.1)
    path, env = sim.shared_dir("nfs-nolock")
    outcomes = []
    for label, extra in (("plain", {"SHAREDFS_DISABLE": "1"}), ("sharedfs", {})):
        server.reset()
        results = _readers(sim, WIDS_READER, [json.dumps(urls), str(path / label), str(SHARD_SAMPLES)],
                           {**env, **extra}, nodes=2, count=2)
        broken = [r for r in results if _samples(r) != expected]
        if broken:
            outcomes.append(Outcome(True, f"{len(broken)}/2 readers: {last_error(broken[0])}"))
        else:
            fetches = server.counts()
            outcomes.append(Outcome(any(n != 1 for n in fetches.values()),
                                    f"2/2 readers (2 nodes) read all {len(expected)} samples; fetches per shard: "
                                    f"max {max(fetches.values())}"))
    return outcomes[0], outcomes[1]


WDS_READER = """
    import json, sys
    # webdataset runs without torch (its pytorch.py); not importing it spares 8 readers 2 s of CPU each.
    sys.modules["torch"] = None
    from sharedfs.demo.shardserver import sample_digest, start_together
    import webdataset as wds
    urls, cache, gate = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
    ds = wds.WebDataset(urls, cache_dir=cache, shardshuffle=False, empty_check=False)
    start_together(gate)  # the ranks of one job hit the server at once
    print(json.dumps({s["__key__"]: sample_digest(s["__key__"], s["bin"]) for s in ds}))
"""


def webdataset_duplicates(sim: Sim) -> tuple[Outcome, Outcome]:
    """webdataset's cache has no lock at all: every reader of a shared cache_dir downloads every shard."""
    server, urls, expected = _shard_server(sim, delay=0.3)
    # GPFS-like (flock excludes within a node only) under FUSE; ENOLCK NFS under the fallback.
    path, env = sim.shared_dir("localflock" if sim.fuse else "nfs-nolock")
    nodes = 2 if sim.fuse else 1
    outcomes = []
    for label, extra in (("plain", {"SHAREDFS_DISABLE": "1"}), ("sharedfs", {})):
        server.reset()
        (path / label).mkdir()  # webdataset refuses a cache_dir that does not exist
        results = _readers(sim, WDS_READER, [json.dumps(urls), str(path / label)], {**env, **extra},
                           nodes=nodes, count=8)
        fetches = [server.counts().get(name, 0) for name in server.shard_names()]
        where = f"8 readers on {nodes} node{'s' if nodes > 1 else ''}"
        broken = [r for r in results if _samples(r) != expected]
        evidence = f"{where}: fetches per shard: mean {sum(fetches) / len(fetches):.1f}, max {max(fetches)}"
        if broken:  # seen here: the shard missing right after the readers' concurrent renames onto it
            error = last_error(broken[0]).replace(f"{path}/", "")
            evidence += f"; {len(broken)}/8 readers crashed: {error[:100]}"
        outcomes.append(Outcome(bool(broken) or any(n != 1 for n in fetches), evidence))
    return outcomes[0], outcomes[1]

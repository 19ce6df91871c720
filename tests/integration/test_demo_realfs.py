"""`sharedfs demo --fs KIND`: the cross-node scenarios on a real filesystem, each with the cause its run showed.

The demo's scenarios were written against hostilefs, our FUSE fake.  On real client mounts (one per
node, :mod:`sharedfs.demo.realfs`) the same programs fail for the filesystem's own reasons, or not
at all: MooseFS mounted with node-local locks (as GPFS flock and Lustre ``localflock``) lets two
holders in at once; JuiceFS's flock excludes across clients, and its failure is a stale read through
the client cache; no FUSE client here shows the ``makedirs`` EEXIST-then-"not a directory" failure of
kernel NFS clients (cpython#142916, lingua#49).  Before ``--fs``, the demo printed "flock that excludes
one node only" for whatever it ran on; now the cause is derived from what each run recorded.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from harness.realfs import require_realfs
from helpers import clean_env

# xdist_group: one real volume at a time; MooseFS volumes of two workers at once disagreed with runs alone.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("realfs")]

FLOCK = "flock that excludes one node only (GPFS, localflock)"
MAKEDIRS = "6 ranks makedirs on a lagging filesystem"


def demo(*args: str, expect: int = 0, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "sharedfs", "demo", *args], check=False, capture_output=True,
                          text=True, env=env or clean_env(), timeout=900, cwd="/tmp")
    assert proc.returncode == expect, proc.stdout + proc.stderr
    return proc


def only(fs: str, name: str) -> dict:
    report = json.loads(demo("--fs", fs, "--only", name, "--json").stdout)
    assert report["fs"] == fs and report["mode"].startswith(fs), report
    (scenario,) = report["scenarios"]
    assert scenario["fs"] == fs and scenario["error"] is None and scenario["skipped"] is None, scenario
    print(f"{fs}: {name}: without {scenario['without']['evidence']}; with {scenario['with_sharedfs']['evidence']}; "
          f"cause {scenario['cause']}")
    return scenario


def counts(evidence: str) -> tuple[int, int, int]:
    """(counter, handovers overlapped, reads stale) as the evidence line states them."""
    found = re.search(r"counter (\d+)/80 .*; (\d+) of 79 handovers overlapped, (\d+) of 80 reads stale", evidence)
    assert found, evidence
    return int(found[1]), int(found[2]), int(found[3])


def test_moosefs_with_node_local_locks_fails_for_the_reason_the_scenario_names() -> None:
    require_realfs("moosefs")
    scenario = only("moosefs", FLOCK)
    value, overlapped, _ = counts(scenario["without"]["evidence"])
    assert scenario["without"]["failed"] and value < 80 and overlapped > 0  # stock: two holders at once
    assert scenario["cause"].startswith(f"node-local flock: two holders at once in {overlapped} of 79 handovers")
    assert counts(scenario["with_sharedfs"]["evidence"]) == (80, 0, 0) and scenario["fixed"]


def test_juicefs_prints_the_cause_its_run_showed_not_node_local_flock() -> None:
    require_realfs("juicefs")
    scenario = only("juicefs", FLOCK)
    value, overlapped, stale = counts(scenario["without"]["evidence"])
    # Stock fails, but JuiceFS's flock excludes across clients: the next holder reads the old counter.
    assert scenario["without"]["failed"] and value < 80 and overlapped == 0 and stale > 0
    assert "node-local" not in scenario["cause"] and "one node" not in scenario["cause"], scenario["cause"]
    assert scenario["cause"].startswith(f"the next holder read a stale value through the client cache ({stale} of "
                                        "80 reads)"), scenario["cause"]
    assert counts(scenario["with_sharedfs"]["evidence"]) == (80, 0, 0) and scenario["fixed"]


def test_on_hostilefs_the_cause_is_derived_from_the_run_too() -> None:
    report = json.loads(demo("--only", FLOCK, "--json").stdout)  # --fs hostilefs is the default
    (scenario,) = report["scenarios"]
    assert report["fs"] == "hostilefs" and scenario["fs"] == "hostilefs"
    value, overlapped, _ = counts(scenario["without"]["evidence"])
    assert scenario["without"]["failed"] and value < 80 and overlapped > 0
    assert scenario["cause"].startswith(f"node-local flock: two holders at once in {overlapped} of 79 handovers")
    assert counts(scenario["with_sharedfs"]["evidence"]) == (80, 0, 0) and scenario["fixed"]


def test_makedirs_on_a_real_client_is_reported_as_not_reproduced() -> None:
    require_realfs("juicefs")
    scenario = only("juicefs", MAKEDIRS)
    # The programs ran on 3 lagging client mounts, stock first: no rank failed, so nothing is claimed.
    assert not scenario["without"]["failed"] and not scenario["with_sharedfs"]["failed"], scenario
    assert scenario["not_reproduced"].startswith("not reproduced on juicefs: its client does not show it (0 of 18 ")
    assert scenario["verdict"] == "not reproduced on juicefs" and not scenario["fixed"]


def test_scenarios_that_are_not_a_real_filesystems_behaviour_are_listed_with_why() -> None:
    require_realfs("juicefs")
    report = json.loads(demo("--fs", "juicefs", "--only", "NFS without lockd", "--only", "OLMo-core",
                             "--json").stdout)
    for scenario in report["scenarios"]:
        assert scenario["skipped"].startswith("not run on juicefs: "), scenario
        assert scenario["without"] is None  # nothing ran, so nothing is counted
    assert "not run on juicefs" in report["summary"]


def test_an_unknown_filesystem_is_one_line_and_exit_2() -> None:
    proc = demo("--fs", "lustre", "--only", FLOCK, expect=2)
    assert proc.stderr.splitlines() == [proc.stderr.strip()] and proc.stdout == "", proc.stderr
    line = proc.stderr.strip()
    assert line.startswith("sharedfs demo: --fs 'lustre' is not a filesystem the demo knows; use one of hostilefs, "
                           "juicefs, moosefs, glusterfs"), line


def test_a_filesystem_that_cannot_start_here_names_its_install_command() -> None:
    # Without /usr/sbin on PATH, glusterd is not found: what a machine without the packages sees.
    proc = demo("--fs", "gluster", "--only", FLOCK, expect=2, env=clean_env({"PATH": "/usr/bin:/bin"}))
    assert proc.stderr.splitlines() == [proc.stderr.strip()] and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("sharedfs demo: glusterfs cannot run here: ")
    assert "apt-get install glusterfs-server glusterfs-client" in proc.stderr, proc.stderr

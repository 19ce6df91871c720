"""``sharedfs.machinery.log.decision``: a line no handler would print costs no plugin call.

Every new lock directory says which kind it got; at the default level (warning) nobody reads that
line, and asking the plugins who this process is (to let only the node leader speak) was part of
every warm ``load_dataset`` + ``map`` (benchmarks/datasets_load.py).  With ``SHAREDFS_LOG=info`` the
node leader still prints it once, and another rank does not.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

import sharedfs.types
from sharedfs.machinery import log as decisions
from sharedfs.model.identity import ProcessIdentity


class _Counting:
    """A plugin that says which rank this is and counts how often it was asked."""

    def __init__(self, local_rank: int) -> None:
        self.asked = 0
        self.local_rank = local_rank

    @sharedfs.types.hookimpl(tryfirst=True)
    def sharedfs_process_identity(self, environ: Any) -> ProcessIdentity:
        self.asked += 1
        return ProcessIdentity(rank=self.local_rank, local_rank=self.local_rank, node_id="n1")


@pytest.fixture
def counting(fresh_runtime, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(decisions, "_said", set())

    def register(local_rank: int) -> _Counting:
        plugin = _Counting(local_rank)
        fresh_runtime.registry().pm.register(plugin, name=f"test-counting-{local_rank}")
        return plugin

    return register


def test_at_the_default_level_a_decision_asks_no_plugin_who_this_process_is(counting) -> None:
    plugin = counting(0)
    assert not decisions.log.isEnabledFor(logging.INFO)
    decisions.decision("datasets locks -> flock: test")
    assert plugin.asked == 0


@pytest.mark.parametrize("local_rank, printed", [(0, 1), (3, 0)])
def test_at_info_the_node_leader_says_it_once_and_another_rank_not(counting, fresh_runtime, monkeypatch,
                                                                 caplog, local_rank: int, printed: int) -> None:
    monkeypatch.setenv("SHAREDFS_LOG", "info")
    fresh_runtime.policy()  # sets the logger's level from the setting
    plugin = counting(local_rank)
    with caplog.at_level(logging.INFO, logger="sharedfs"):
        for _ in range(3):
            decisions.decision("datasets locks -> flock: test")
    assert plugin.asked == 1
    assert [r.getMessage() for r in caplog.records].count("datasets locks -> flock: test") == printed

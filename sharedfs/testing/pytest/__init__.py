"""What only the test suite uses: pytest fixtures and the skip rule (imports pytest; the demo never does).

* :mod:`~sharedfs.testing.pytest.plugin` -- the ``hostile_mount``, ``fault_preload`` and
  ``slurm_cluster`` fixtures (load it with
  ``pytest_plugins = ["sharedfs.testing.pytest.plugin"]``);
* :mod:`~sharedfs.testing.pytest.realfs` -- the ``realfs_kind`` and ``real_volume`` fixtures
  (real filesystems, one per kind; loaded by the suite's ``conftest.py``);
* :mod:`~sharedfs.testing.pytest.skips` -- :func:`skip_or_fail`: skip where test
  infrastructure is missing, fail under ``CI``.

The harness these wrap (:mod:`sharedfs.testing`) is importable without pytest.
"""

"""The test suite's harness, not shipped in the wheel: pytest fixtures, the skip rule, a Slurm test cluster.

:mod:`~harness.plugin` (``hostile_mount``, ``fault_preload``, ``slurm_cluster``), :mod:`~harness.realfs`
(``realfs_kind``, ``real_volume``), :mod:`~harness.skips` (:func:`skip_or_fail`) and :mod:`~harness.slurm`.
"""

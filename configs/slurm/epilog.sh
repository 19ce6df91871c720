#!/bin/bash
# Slurm Epilog (slurm.conf: Epilog=/etc/slurm/epilog.d/sharedfs.sh): remove the node-local
# directories sharedfs made for the job that just ended, when its processes were killed before
# their own exit-time cleanup could run (scancel, time limit, OOM, preemption).
# Removes exactly <root>/sharedfs-<uid>/job-<id>/ of this job's user; never another job's or user's.
# Set SHAREDFS_CACHE_ROOT to the same node-local root the jobs use (default: /tmp).
exec sharedfs cleanup --job "$SLURM_JOB_ID" --uid "$SLURM_JOB_UID" ${SHAREDFS_CACHE_ROOT:+--root "$SHAREDFS_CACHE_ROOT"}

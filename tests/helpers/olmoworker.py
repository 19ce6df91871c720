"""One rank of a job that prepares a checkpoint directory with OLMo (ai2-olmo): OLMo's own code, no sharedfs call.

Run by tests/integration/test_olmo.py (through :func:`sharedfs.demo.olmo_core_job.run_job`) as a
plain script in the OLMo venv, one process per rank, with the
``torch.distributed`` environment.  ``Checkpointer._temporary_wd`` is the
directory handling every OLMo checkpointer's ``save_checkpoint`` runs: the
filesystem's local rank 0 makes ``<dir>-tmp`` and every rank waits a fixed 10 s
(``olmo.util.wait_for(lambda: checkpoint_dir_tmp.exists(), ...)``) until it sees
it; after the save, rank 0 renames it to ``<dir>`` and every rank waits for that.
Prints one JSON line: this rank, its node, whether it got through, and the error if not.
"""

import json
import os
import sys
import time
from datetime import timedelta


def main() -> int:
    target = sys.argv[1]
    import torch.distributed as dist
    from olmo.checkpoint import FullCheckpointer
    from olmo.config import TrainConfig

    dist.init_process_group("gloo", timeout=timedelta(seconds=float(os.environ.get("JOB_COLLECTIVE_TIMEOUT", "120"))))
    rank = dist.get_rank()
    report = {"rank": rank, "node": os.environ.get("SHAREDFS_NODE_ID", "")}
    start = time.monotonic()
    try:
        with FullCheckpointer(TrainConfig())._temporary_wd(target) as work_dir:
            (work_dir / f"rank{rank}.txt").write_text(str(rank))  # what a save writes, in the temporary directory
    except BaseException as exc:  # noqa: BLE001 - the report is the point
        report.update(ok=False, error=f"{type(exc).__name__}: {exc}", seconds=round(time.monotonic() - start, 1))
        print(json.dumps(report), flush=True)
        os._exit(1)  # peers may be gone: no collective teardown
    report.update(ok=True, error=None, seconds=round(time.monotonic() - start, 1))
    print(json.dumps(report), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One rank of a job that saves a checkpoint with OLMo-core: OLMo-core's own code, no sharedfs call.

Run by :mod:`sharedfs.demo.olmo_core_job` (the demo's OLMo#829 scenario and
tests/integration/test_olmo_core.py) as a plain script in the OLMo-core venv,
one process per rank, with the ``torch.distributed`` environment (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``...).  Whatever sharedfs does
here, it does through its autoload, as in a user's job.

``olmo_core.distributed.checkpoint.save_state_dict`` prepares the directory
(``_prepare_env_for_save``: the filesystem's local rank 0 creates it, every rank
waits until it sees it) and then saves through ``torch.distributed.checkpoint``.
Prints one JSON line: this rank, its node, whether it saved, and the error if not.

``JOB_TIME_SCALE`` (default 1) scales OLMo-core's fixed wait (``wait_for``'s default
10 s, whichever ``wait_for`` is in place) for tests that scale their filesystem's lag
by as much: the same race, in a fraction of the time.
"""

import json
import os
import sys
import time
from datetime import timedelta


def main() -> int:
    target = sys.argv[1]
    import olmo_core.distributed.checkpoint as checkpoint
    import torch
    import torch.distributed as dist
    from olmo_core.distributed.checkpoint import save_state_dict

    scale = float(os.environ.get("JOB_TIME_SCALE", "1"))
    if scale != 1:
        (fixed_wait,) = checkpoint.wait_for.__defaults__
        checkpoint.wait_for.__defaults__ = (fixed_wait * scale,)
    dist.init_process_group("gloo", timeout=timedelta(seconds=float(os.environ.get("JOB_COLLECTIVE_TIMEOUT", "120"))))
    rank = dist.get_rank()
    report = {"rank": rank, "node": os.environ.get("SHAREDFS_NODE_ID", ""),
              "olmo_shared_fs": os.environ.get("OLMO_SHARED_FS")}
    start = time.monotonic()
    try:
        save_state_dict(target, {f"rank{rank}": torch.full((4,), float(rank))})
    except BaseException as exc:  # noqa: BLE001 - the report is the point
        report.update(ok=False, error=f"{type(exc).__name__}: {exc}", seconds=round(time.monotonic() - start, 1),
                      olmo_shared_fs_after=os.environ.get("OLMO_SHARED_FS"))
        print(json.dumps(report), flush=True)
        os._exit(1)  # peers may be gone: no collective teardown
    report.update(ok=True, error=None, seconds=round(time.monotonic() - start, 1),
                  olmo_shared_fs_after=os.environ.get("OLMO_SHARED_FS"))
    print(json.dumps(report), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

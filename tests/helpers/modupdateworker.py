"""One rank of a job loading remote-code models that are updated while it loads them.

``python modupdateworker.py SYNC WAVE DELAY TARGET...``: imports transformers, then for each target (a hub
repo id or a local model directory) waits for ``SYNC/go-<i>`` (wave 1) or ``SYNC/updated-<i>`` (wave 2: the test
updates the model once wave 1 has loaded it) and ``DELAY`` seconds more (the ranks of a wave arrive one after
another), loads ``AutoConfig.from_pretrained(target, trust_remote_code=True)``, says so in ``SYNC/done-<i>-<rank>``
and prints one JSON line per target: the version the configuration module and its relatively imported helpers
declare (``VERSION``) and the module's name (its directory in ``HF_MODULES_CACHE``), or the exception's type and
message.  The test checks that each rank got one version, whole.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from sharedfs.demo.remotecode import await_trial, failure


def main() -> int:
    sync, wave, delay, targets = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3]), sys.argv[4:]
    start = "go" if wave == "1" else "updated"
    from transformers import AutoConfig

    rank = os.environ.get("SHAREDFS_TEST_INDEX", "0")
    for i, target in enumerate(targets):
        if not await_trial(sync, i, {"target": target}, start, 300):
            return 1
        time.sleep(delay)
        try:
            config = AutoConfig.from_pretrained(target, trust_remote_code=True)
            module = sys.modules[type(config).__module__]
            helpers = sys.modules[module.__name__.rsplit(".", 1)[0] + ".helpers"]
            seen = {"config": module.VERSION, "helpers": helpers.VERSION, "size": config.hidden_size,
                    "module": module.__name__}
        except Exception as exc:  # noqa: BLE001 - every failure is reported and counted by the test
            print(json.dumps({"target": target, **failure(exc)}), flush=True)
        else:
            print(json.dumps({"target": target, "ok": True, **seen}), flush=True)
        (sync / f"done-{i}-{rank}").touch()
    return 0


if __name__ == "__main__":
    sys.exit(main())

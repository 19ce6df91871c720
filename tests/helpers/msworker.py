"""One ModelScope user: downloads a file into a hub cache through ``modelscope_hub``'s own download path.

The hub is unreachable here, so only the network fetch is replaced (in this process):
``DownloadManager._download_with_resume`` writes the file's bytes as the hub's would land, after
holding for ``--hold`` seconds, and appends the interval it ran in to ``--log`` (one JSON line).
Everything around it is modelscope_hub's: ``download_file``, its cache check, its lock path and
``_optional_file_lock`` (stock, or sharedfs's), its download deadline.

Prints one JSON line: ``{"ok": ..., "error": ..., "lock": <module of _optional_file_lock>}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

DATA = b"modelscope weights\n" * 64


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("cache")
    parser.add_argument("--name", default="weights.bin")
    parser.add_argument("--times", type=int, default=1, help="downloads in a row (force=True after the first)")
    parser.add_argument("--hold", type=float, default=0.0, help="seconds each fetch takes")
    parser.add_argument("--log", help="append each fetch's interval here")
    parser.add_argument("--ready", help="create this file once the first fetch is under way (it holds the lock)")
    args = parser.parse_args()

    from modelscope_hub import _download
    from modelscope_hub.api import HubApi

    def fetch(self: object, repo_id: str, repo_type: str, file_path: str, revision: str, target: Path,
              **_: object) -> Path:
        began = time.time()
        if args.ready:
            Path(args.ready).touch()
        time.sleep(args.hold)
        part = target.with_name(target.name + f".{os.getpid()}.part")
        part.write_bytes(DATA)
        os.replace(part, target)
        if args.log:
            with open(args.log, "a") as log:
                log.write(json.dumps({"pid": os.getpid(), "node": os.environ.get("SHAREDFS_NODE_ID"),
                                      "began": began, "ended": time.time()}) + "\n")
        return target

    _download.DownloadManager._download_with_resume = fetch  # type: ignore[method-assign]
    lock = _download._optional_file_lock.__module__
    downloader = HubApi().downloader
    try:
        for attempt in range(args.times):
            path = downloader.download_file("org/tiny", "model", args.name, cache_dir=Path(args.cache),
                                            file_size=len(DATA), force=attempt > 0)
            assert path.read_bytes() == DATA, path
    except Exception as exc:  # noqa: BLE001 - the test counts failures by their text
        print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}", "lock": lock}))
        sys.exit(1)
    print(json.dumps({"ok": True, "error": None, "lock": lock}))


if __name__ == "__main__":
    main()

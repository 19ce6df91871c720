"""ModelScope users download into one hub cache through ``modelscope_hub``'s own download path.

The hub is unreachable in a test or a demo, so only the network fetch is replaced (in each
process): ``DownloadManager._download_with_resume`` writes the file's bytes as the hub's would land,
after holding for ``--hold`` seconds, and appends the interval it ran in to ``--log`` (one JSON
line).  Everything around it is modelscope_hub's: ``download_file``, its cache check, its lock path
(``<cache>/.lock/file_<sha256>.lock``) and ``_optional_file_lock`` (stock, or sharedfs's), its
download deadline.  Nothing of sharedfs is called: with sharedfs installed the modelscope shim
applies at ``import modelscope_hub``.

``python -m sharedfs.demo.scenario_modelscope CACHE [--name --times --hold --log --ready]`` is one
user; it prints one JSON line: ``{"ok": ..., "error": ..., "lock": <module of _optional_file_lock>}``.
:func:`run` starts users on simulated nodes and returns their lines.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Mapping, Sequence

DATA = b"modelscope weights\n" * 64


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("cache")
    parser.add_argument("--name", default="weights.bin")
    parser.add_argument("--times", type=int, default=1, help="downloads in a row (force=True after the first)")
    parser.add_argument("--hold", type=float, default=0.0, help="seconds each fetch takes")
    parser.add_argument("--log", help="append each fetch's interval here")
    parser.add_argument("--ready", help="create this file once the first fetch is under way (it holds the lock)")
    args = parser.parse_args(argv)

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
    except Exception as exc:  # noqa: BLE001 - the caller counts failures by their text
        print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}", "lock": lock}))
        sys.exit(1)
    print(json.dumps({"ok": True, "error": None, "lock": lock}))


def run(cache: Path, nodes: Mapping[str, int], env: Mapping[str, str], *args: str,
        timeout: float = 120.0) -> list[dict]:
    """One user per process of ``nodes`` downloading into ``cache``; each one's JSON line (with its ``node``)."""
    from sharedfs.demo.nodes import run_on_nodes

    results = run_on_nodes([sys.executable, "-m", __name__, str(cache), *args], nodes, env=env, timeout=timeout,
                           cwd="/")
    out = []
    for result in results:
        lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
        if lines:
            report = json.loads(lines[-1])
        else:  # died before reporting (an import error, a crash)
            tail = result.stderr.strip().splitlines()[-1:] or [f"exit {result.returncode}"]
            report = {"ok": False, "error": f"died: {tail[0]}", "lock": None}
        report["node"] = result.node
        out.append(report)
    return out


if __name__ == "__main__":
    main()

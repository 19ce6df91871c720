"""A real volume at one path on every simulated node, each node through its own client mount.

On a cluster every node mounts the shared filesystem at the same path (``/shared``), and ranks pass
paths to each other (a chosen checkpoint, a log dir).  :func:`node_python` writes a ``python`` that
runs the interpreter in a private mount namespace where ``at`` is its node's client mount (chosen by
``SHAREDFS_NODE_ID``), so a test's worker code runs unchanged on a real volume: the same path on
every node, each node's ranks through their own client's caches.  Children (gloo peers, compilers)
inherit the namespace; it ends with the last of them.  Linux, root.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = ["node_python"]

SCRIPT = """#!/bin/sh
# This node's client mount, bound at {at} in a mount namespace of its own.
case "$SHAREDFS_NODE_ID" in
{cases}
  *) echo "node_python: no client mount for node '$SHAREDFS_NODE_ID'" >&2; exit 97 ;;
esac
exec unshare --mount --propagation private -- /bin/sh -c 'mount --bind "$1" "$2" && shift 2 && exec "$@"' \\
    sh "$mount" {at} {python} "$@"
"""


def node_python(mounts: Mapping[str, Path], at: Path, where: Path) -> str:
    """The path of an executable (written as ``where``) that runs ``python`` with ``at`` = its node's mount.

    ``mounts`` maps each node id to that node's client mount (``Volume.mounts[i]``); ``at`` is created.
    """
    at.mkdir(parents=True, exist_ok=True)
    cases = "\n".join(f"  {shlex.quote(node)}) mount={shlex.quote(str(path))} ;;" for node, path in mounts.items())
    where.write_text(SCRIPT.format(at=shlex.quote(str(at)), cases=cases, python=shlex.quote(sys.executable)))
    where.chmod(0o755)
    return str(where)

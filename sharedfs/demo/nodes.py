"""Processes that behave as if they ran on different cluster nodes.

A "simulated node" is just an environment: ``SHAREDFS_NODE_ID`` names the
node (hostilefs reads it to decide what each caller may see and whom its
locks exclude) and ``SHAREDFS_CACHE_ROOT`` points at that node's private
node-local directory.  Two helpers start such processes:

* :func:`run_on_nodes` runs one script in N processes per node at once and
  returns what each printed, e.g. "8 processes across 2 nodes";
* :class:`NodeProcess` is a long-lived interpreter on one node that runs code
  sent by the test step by step, to interleave operations of several nodes
  precisely (node A locks, node B tries, node A unlocks, ...).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Optional, Sequence, Union

__all__ = [
    "CACHE_ROOT_ENV",
    "INDEX_ENV",
    "NODE_ID_ENV",
    "NodeProcess",
    "NodeResult",
    "NodesTimeout",
    "RemoteError",
    "assert_all_ok",
    "node_env",
    "run_on_nodes",
]

NODE_ID_ENV = "SHAREDFS_NODE_ID"
CACHE_ROOT_ENV = "SHAREDFS_CACHE_ROOT"
INDEX_ENV = "SHAREDFS_TEST_INDEX"
COUNT_ENV = "SHAREDFS_TEST_COUNT"

_PathLike = Union[str, "os.PathLike[str]"]


def node_env(
    node_id: str,
    base: Optional[Mapping[str, str]] = None,
    *,
    local_root: Optional[_PathLike] = None,
    **extra: object,
) -> dict[str, str]:
    """Environment of a process on simulated node ``node_id``.

    ``base`` defaults to ``os.environ``.  With ``local_root``, the node gets
    ``SHAREDFS_CACHE_ROOT=<local_root>/<node_id>`` (created), standing in for
    the node-local disk.  ``extra`` items are added as strings.
    """
    env = dict(os.environ if base is None else base)
    env[NODE_ID_ENV] = str(node_id)
    if local_root is not None:
        root = Path(local_root) / str(node_id)
        root.mkdir(parents=True, exist_ok=True)
        env[CACHE_ROOT_ENV] = str(root)
    env.update({key: str(value) for key, value in extra.items()})
    return env


class NodeResult(NamedTuple):
    """How one process of :func:`run_on_nodes` ended."""

    returncode: int
    stdout: str
    stderr: str
    node: str
    index: int  # type: ignore[assignment]  # the process's index on its node (shadows tuple.index)


class NodesTimeout(TimeoutError):
    """:func:`run_on_nodes` ran out of time; ``results`` holds what was collected."""

    def __init__(self, message: str, results: list[NodeResult]) -> None:
        super().__init__(message)
        self.results = results


def _assignments(nodes: Union[Mapping[str, int], Sequence[str]]) -> list[str]:
    if isinstance(nodes, Mapping):
        return [node for node, count in nodes.items() for _ in range(count)]
    return [str(node) for node in nodes]


def run_on_nodes(
    code_or_argv: Union[str, Sequence[str]],
    nodes: Union[Mapping[str, int], Sequence[str]],
    *,
    env: Optional[Mapping[str, str]] = None,
    timeout: float = 60.0,
    cwd: Optional[_PathLike] = None,
    local_root: Optional[_PathLike] = None,
) -> list[NodeResult]:
    """Run processes on simulated nodes concurrently and wait for all of them.

    ``code_or_argv`` is Python source (run with ``sys.executable -c``,
    dedented) or a full argv.  ``nodes`` is ``{"a": 4, "b": 4}`` (processes
    per node) or a list with one node id per process.  Each process gets
    :func:`node_env` over ``env`` plus ``SHAREDFS_TEST_INDEX`` (0..N-1, in
    start order) and ``SHAREDFS_TEST_COUNT`` (N).  Results come back in index
    order.  On timeout every process is killed and :class:`NodesTimeout` is
    raised carrying the partial results.
    """
    if isinstance(code_or_argv, str):
        argv = [sys.executable, "-c", textwrap.dedent(code_or_argv)]
    else:
        argv = list(code_or_argv)
    assigned = _assignments(nodes)
    started: list[tuple[str, subprocess.Popen, Any, Any]] = []
    try:
        for index, node in enumerate(assigned):
            # Temporary files, not pipes: nobody has to drain N pipes at once.
            out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
            penv = node_env(node, env, local_root=local_root,
                            **{INDEX_ENV: index, COUNT_ENV: len(assigned)})
            proc = subprocess.Popen(argv, env=penv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
            started.append((node, proc, out, err))
        deadline = time.monotonic() + timeout
        timed_out = False
        for _, proc, _, _ in started:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
                break
    finally:
        for _, proc, _, _ in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    results = []
    for index, (node, proc, out, err) in enumerate(started):
        texts = []
        for stream in (out, err):
            stream.seek(0)
            texts.append(stream.read().decode("utf-8", "replace"))
            stream.close()
        results.append(NodeResult(proc.returncode, texts[0], texts[1], node, index))
    if timed_out:
        raise NodesTimeout(f"processes on nodes still running after {timeout}s:\n{_describe(results)}", results)
    return results


def _describe(results: Sequence[NodeResult]) -> str:
    parts = []
    for r in results:
        parts.append(f"--- process {r.index} on node {r.node!r}: exit {r.returncode}\n"
                     f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}")
    return "\n".join(parts)


def assert_all_ok(results: Sequence[NodeResult]) -> None:
    """Raise AssertionError showing every process's output unless all exited 0."""
    if any(r.returncode != 0 for r in results):
        raise AssertionError("some node processes failed:\n" + _describe(results))


# --------------------------------------------------------------------------
# interactive node processes
# --------------------------------------------------------------------------

# The child evaluates one JSON-encoded snippet per stdin line in a persistent
# namespace and answers on a dedicated pipe, so prints of the code under test
# cannot corrupt the protocol.
_AGENT = r"""
import json, os, sys, traceback
reply = os.fdopen(int(sys.argv[1]), "w", buffering=1)
ns = {"__name__": "__node__"}
for line in sys.stdin:
    code = json.loads(line)
    try:
        try:
            compiled = compile(code, "<node>", "eval")
        except SyntaxError:
            exec(compile(code, "<node>", "exec"), ns)
            value = None
        else:
            value = eval(compiled, ns)
        try:
            out = json.dumps({"ok": True, "value": value})
        except (TypeError, ValueError):
            out = json.dumps({"ok": True, "value": repr(value)})
    except BaseException as exc:
        out = json.dumps({"ok": False, "type": type(exc).__name__, "errno": getattr(exc, "errno", None),
                          "message": str(exc), "traceback": traceback.format_exc()})
    reply.write(out + "\n")
"""


class RemoteError(Exception):
    """Code run by a :class:`NodeProcess` raised; ``errno``/``type_name`` say what."""

    def __init__(self, node: str, type_name: str, errno: Optional[int], message: str, traceback: str) -> None:
        super().__init__(f"{type_name} on node {node!r}: {message}")
        self.node = node
        self.type_name = type_name
        self.errno = errno
        self.message = message
        self.traceback = traceback


class NodeProcess:
    """A Python interpreter running as a process of simulated node ``node_id``.

    ``run(code)`` executes ``code`` there (statements, or an expression whose
    JSON-able value is returned) with state kept between calls; exceptions
    come back as :class:`RemoteError`.  ``submit`` + ``result(timeout)``
    split a call to show that it blocks::

        a, b = NodeProcess("a"), NodeProcess("b")
        a.run(f"import fcntl; f = open({path!r}); fcntl.flock(f, fcntl.LOCK_EX)")
        b.run(f"import fcntl; f = open({path!r})")
        b.submit("fcntl.flock(f, fcntl.LOCK_EX)")
        with pytest.raises(TimeoutError):
            b.result(timeout=0.5)          # still waiting for a's lock
        a.run("f.close()")
        b.result(timeout=5)                # and now it has it
    """

    def __init__(
        self,
        node_id: str,
        *,
        env: Optional[Mapping[str, str]] = None,
        local_root: Optional[_PathLike] = None,
        cwd: Optional[_PathLike] = None,
        **extra: object,
    ) -> None:
        self.node = str(node_id)
        read_fd, write_fd = os.pipe()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _AGENT, str(write_fd)],
                stdin=subprocess.PIPE,
                env=node_env(node_id, env, local_root=local_root, **extra),
                cwd=cwd,
                pass_fds=(write_fd,),
            )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        self._reply_fd = read_fd
        self._buffer = b""
        self._pending = 0

    @property
    def pid(self) -> int:
        return self._proc.pid

    def __enter__(self) -> "NodeProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<NodeProcess node={self.node!r} pid={self.pid}>"

    def submit(self, code: str) -> None:
        """Send ``code`` without waiting for it to finish."""
        assert self._proc.stdin is not None
        self._proc.stdin.write((json.dumps(textwrap.dedent(code)) + "\n").encode())
        self._proc.stdin.flush()
        self._pending += 1

    def result(self, timeout: Optional[float] = 30.0) -> Any:
        """Wait for the oldest submitted snippet; TimeoutError if still running."""
        if not self._pending:
            raise RuntimeError("nothing submitted")
        line = self._readline(timeout)
        self._pending -= 1
        reply = json.loads(line)
        if reply["ok"]:
            return reply["value"]
        raise RemoteError(self.node, reply["type"], reply["errno"], reply["message"], reply["traceback"])

    def run(self, code: str, timeout: Optional[float] = 30.0) -> Any:
        """Execute ``code`` on the node and return its value (see class doc)."""
        if self._pending:
            raise RuntimeError("collect the pending result() first")
        self.submit(code)
        return self.result(timeout)

    def _readline(self, timeout: Optional[float]) -> bytes:
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self._reply_fd], [], [], remaining)
            if not ready:
                raise TimeoutError(f"node {self.node!r} still busy after {timeout}s")
            chunk = os.read(self._reply_fd, 65536)
            if not chunk:
                raise RuntimeError(f"node process {self.node!r} exited (code {self._proc.wait()})")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def close(self, timeout: float = 5.0) -> Optional[int]:
        """End the process (EOF, then kill if it is stuck); returns its exit code."""
        if self._reply_fd < 0:
            return self._proc.returncode
        try:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
        except OSError:
            pass
        try:
            self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        os.close(self._reply_fd)
        self._reply_fd = -1
        return self._proc.returncode

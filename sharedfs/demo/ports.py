"""TCP ports for test daemons and torch.distributed rendezvous that concurrent tests cannot take from each other.

A port found free by binding to port 0 is in the kernel's ephemeral range, and is released
before the daemon (``slurmctld``, a rank's TCPStore) binds it: in between, any outgoing
connection on the machine -- another test's gloo mesh, pip -- may be given that very port, and
another test process asking the same way may be handed it too.  So the ports come from below
the ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``), which connections never get,
from a slice of its own for each pytest-xdist worker (``PYTEST_XDIST_WORKER``, inherited by
the test's child processes), at a random place in it, and each is checked bindable.
"""

from __future__ import annotations

import os
import random
import re
import socket

__all__ = ["free_port", "free_ports"]

#: Where the slices start (above the well-known and most registered services), and each worker's share.
FIRST = 20000
SLICE = 1000
EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"


def _ephemeral_start() -> int:
    try:
        with open(EPHEMERAL_RANGE) as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _slice() -> range:
    """This worker's ports: ``gw0`` the first slice, ``gw1`` the next, ... (one process without xdist: the first)."""
    match = re.fullmatch(r"gw(\d+)", os.environ.get("PYTEST_XDIST_WORKER", ""))
    slices = max(1, (_ephemeral_start() - FIRST) // SLICE)
    start = FIRST + (int(match.group(1)) % slices if match else 0) * SLICE
    return range(start, start + SLICE)


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the daemons bind (TIME_WAIT is no use)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count: int) -> list[int]:
    """``count`` different ports, free now, outside the ephemeral range and in this worker's slice."""
    ports = _slice()
    candidates = list(ports)
    random.SystemRandom().shuffle(candidates)
    found: list[int] = []
    for port in candidates:
        if len(found) == count:
            break
        if _bindable(port):
            found.append(port)
    if len(found) < count:
        raise OSError(f"no {count} free TCP ports in {ports.start}-{ports.stop - 1} (this worker's slice)")
    return found


def free_port() -> int:
    """One port, as :func:`free_ports`."""
    return free_ports(1)[0]

"""pytest plugin loaded (``-p sharedfs_upstream``) into every upstream suite run by tests/upstream/run.py.

Written for this project; it changes no test.  It

* records each test's outcome by node id (any failing phase = failed, collection errors too)
  into the JSON file named by ``SHAREDFS_UPSTREAM_RECORD``, with the first lines of the
  failure, so run.py compares exact ids instead of parsing terminal output;
* records which attributes of the framework under test sharedfs has replaced (objects whose
  ``__module__`` is ``sharedfs.*``), so a run that was meant to have sharedfs active and does
  not (or the reverse) is reported as invalid instead of being compared;
* refuses connections to anything but loopback (``SHAREDFS_UPSTREAM_NETWORK=0``), so a network
  test that is not in deselect.txt fails at once in both modes instead of hanging CI on a
  firewall timeout.  Subprocesses such as curl are not covered; those tests are deselected.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import os
import socket
import sys
import time

_RESULTS: dict[str, dict] = {}
_COLLECTION_ERRORS: dict[str, str] = {}
_DESELECTED = [0]
_STARTED = [time.monotonic()]


# -- network guard ---------------------------------------------------------------------------------

def _is_loopback(host) -> bool:
    if host is None:
        return True
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    host = str(host)
    if host in ("localhost", "") or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def _refuse(what) -> OSError:
    return OSError(errno.ENETUNREACH, f"network disabled by tests/upstream/run.py (non-loopback {what})")


def _install_network_guard() -> None:
    real_getaddrinfo = socket.getaddrinfo
    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex

    def getaddrinfo(host, *args, **kwargs):
        if not _is_loopback(host):
            raise socket.gaierror(socket.EAI_NONAME, f"network disabled by tests/upstream/run.py ({host!r})")
        return real_getaddrinfo(host, *args, **kwargs)

    def _check(sock, address):
        if sock.family in (socket.AF_INET, socket.AF_INET6) and isinstance(address, tuple):
            if not _is_loopback(address[0]):
                raise _refuse(address[0])

    def connect(self, address):
        _check(self, address)
        return real_connect(self, address)

    def connect_ex(self, address):
        _check(self, address)
        return real_connect_ex(self, address)

    socket.getaddrinfo = getaddrinfo
    socket.socket.connect = connect
    socket.socket.connect_ex = connect_ex


# -- which framework attributes sharedfs replaced --------------------------------------------------

def _sharedfs_replacements(prefixes) -> list[str]:
    found = []
    for name, module in list(sys.modules.items()):
        if module is None or not any(name == p or name.startswith(p + ".") for p in prefixes):
            continue
        try:
            items = list(vars(module).items())
        except TypeError:
            continue
        for attr, value in items:
            owners = [(f"{name}.{attr}", value)]
            if isinstance(value, type) and getattr(value, "__module__", None) == name:
                owners += [(f"{name}.{attr}.{a}", v) for a, v in list(vars(value).items())]
            for label, obj in owners:
                mod = getattr(obj, "__module__", None)
                if not isinstance(mod, str):
                    func = getattr(obj, "__func__", None) or getattr(obj, "fget", None)
                    mod = getattr(func, "__module__", None)
                if isinstance(mod, str) and mod.startswith("sharedfs"):
                    found.append(label)
    return sorted(set(found))


# -- hooks -----------------------------------------------------------------------------------------

def pytest_configure(config):
    if os.environ.get("SHAREDFS_UPSTREAM_NETWORK", "1") == "0":
        _install_network_guard()


def pytest_collectreport(report):
    if report.failed:
        _COLLECTION_ERRORS[report.nodeid] = _message(report)


def pytest_deselected(items):
    _DESELECTED[0] += len(items)


def _message(report) -> str:
    try:
        text = report.longreprtext
    except Exception:  # noqa: BLE001 - a report we cannot render still counts
        text = str(report.longrepr)
    lines = [line for line in text.splitlines() if line.startswith("E ")]
    chosen = lines[:12] if lines else text.strip().splitlines()[-12:]
    return "\n".join(chosen)[:3000]


def pytest_runtest_logreport(report):
    entry = _RESULTS.setdefault(report.nodeid, {"outcome": "passed", "message": "", "duration": 0.0})
    entry["duration"] += getattr(report, "duration", 0.0) or 0.0
    if report.failed:
        if entry["outcome"] != "failed":
            entry["outcome"] = "failed"
            entry["when"] = report.when
            entry["message"] = _message(report)
    elif report.skipped and entry["outcome"] == "passed":
        entry["outcome"] = "skipped"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        entry["message"] = str(reason)[:500]


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("SHAREDFS_UPSTREAM_RECORD")
    if not path:
        return
    prefixes = [p for p in os.environ.get("SHAREDFS_UPSTREAM_MODULES", "").split(",") if p]
    record = {
        "exitstatus": int(exitstatus),
        "collected": getattr(session, "testscollected", None),
        "deselected": _DESELECTED[0],
        "seconds": round(time.monotonic() - _STARTED[0], 2),
        "tests": _RESULTS,
        "collection_errors": _COLLECTION_ERRORS,
        "sharedfs_file": getattr(sys.modules.get("sharedfs"), "__file__", None),
        "sharedfs_replacements": _sharedfs_replacements(prefixes),
    }
    with open(path, "w") as handle:
        json.dump(record, handle, indent=1, sort_keys=True)

"""``sharedfs.disable()`` / ``sharedfs.enable()``: switch sharedfs off and on inside a running process."""

from __future__ import annotations

import _sharedfs_bootstrap as _bootstrap
from sharedfs.machinery import pending, standin
from sharedfs.startup import activation


def disable() -> None:
    """Undo every patch and stop watching imports, for the rest of this process."""
    _bootstrap.uninstall()
    standin.withdraw_all()
    pending.withdraw()
    activation.unpatch_all()


def enable() -> None:
    """Watch imports again and patch the targets already imported (ignores ``SHAREDFS_DISABLE=1``)."""
    _bootstrap.install_finder(respect_disable=False)
    _bootstrap.add_targets(activation.targets())
    activation.activate_imported()

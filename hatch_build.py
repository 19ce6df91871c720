"""Editable installs get only the autoload files, not copies of plugins/ and shims/.

hatchling applies ``force-include`` to editable wheels too; copies there would
shadow nothing (the checkout's regular package wins) but go stale silently.
"""

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

AUTOLOAD = {"autoload/sharedfs.pth": "sharedfs.pth", "autoload/sharedfs.start": "sharedfs.start"}


class AutoloadOnlyForEditable(BuildHookInterface):
    def initialize(self, version, build_data):
        if version == "editable":
            build_data["force_include_editable"] = dict(AUTOLOAD)

"""Built-in shims (installed as ``sharedfs.shims``): one module per framework.

Each module defines a :class:`~sharedfs.types.Shim` per target module (mmengine and torch
patch submodules that load on demand) and returns them from ``sharedfs_register_shims``;
each shim is one row of ``_sharedfs_bootstrap.TARGETS``.  A shim imports its names from
:mod:`sharedfs.types`, applies the policy it is given, never imports another shim, and
imports its framework only inside ``apply``.
"""

# In a source checkout this folder is also importable as the top-level ``shims`` package,
# which would load each module a second time, with state of its own.  There is one name.
if __name__ != "sharedfs.shims":
    raise ImportError(f"import sharedfs.shims, not {__name__}: the built-in shims live in the sharedfs package")

"""Built-in deciding plugins (installed as ``sharedfs.plugins``).

Each module implements hooks from :mod:`sharedfs.machinery.hookspecs` to *decide* part
of the policy, imports its names from :mod:`sharedfs.types`, and is named in
``registry.BUILTIN_PLUGINS``.  A plugin never patches anything.
"""

# In a source checkout this folder is also importable as the top-level ``plugins`` package,
# which would load each module a second time, with state of its own.  There is one name.
if __name__ != "sharedfs.plugins":
    raise ImportError(f"import sharedfs.plugins, not {__name__}: the built-in plugins live in the sharedfs package")

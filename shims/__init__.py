"""Built-in shims (installed as ``sharedfs.shims``): one module per framework, one row each in the bootstrap's SHIMS."""

# In a source checkout this folder is also importable as the top-level ``shims`` package,
# which would load each module a second time, with state of its own.  There is one name.
if __name__ != "sharedfs.shims":
    raise ImportError(f"import sharedfs.shims, not {__name__}: the built-in shims live in the sharedfs package")

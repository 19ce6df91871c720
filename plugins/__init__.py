"""Built-in deciding plugins (installed as ``sharedfs.plugins``): each decides part of the policy, never patches."""

# In a source checkout this folder is also importable as the top-level ``plugins`` package,
# which would load each module a second time, with state of its own.  There is one name.
if __name__ != "sharedfs.plugins":
    raise ImportError(f"import sharedfs.plugins, not {__name__}: the built-in plugins live in the sharedfs package")

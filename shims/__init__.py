"""Built-in shims (installed as ``sharedfs.shims``): one module per framework.

Each module defines one :class:`sharedfs.shim.Shim` and returns it from
``sharedfs_register_shims``.  A shim applies the policy it is given and never
imports another shim; it imports its framework only inside ``apply``.
"""

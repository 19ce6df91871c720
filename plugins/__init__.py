"""Built-in deciding plugins (installed as ``sharedfs.plugins``).

Each module implements hooks from :mod:`sharedfs.hookspecs` to *decide* part
of the policy.  A plugin never patches anything.
"""

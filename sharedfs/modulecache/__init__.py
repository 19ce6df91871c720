"""Remote-code module caches (``HF_MODULES_CACHE``): filled once, each file whole (:mod:`sharedfs.modulecache.fill`)."""

# A classic (string-typed) mmengine 0.10.x config with sharedfs: the runtime part to add to your own
# config (or inherit with `_base_ = ["mmengine_sharedfs.py"]`).  Nothing else in the config changes.
#
# custom_imports registers "SharedFSHook" in mmengine's HOOKS; with `pip install sharedfs` it is also
# registered on `import mmengine`, so the import line only matters when sharedfs autoload is off.
custom_imports = dict(imports=["sharedfs.shims.mmengine"], allow_failed_imports=False)

custom_hooks = [
    # Policy settings for this run; they win over SHAREDFS_* and the site TOML (SHAREDFS_CONFIG).
    # Accepted: lock ("auto", "flock", "posix", "soft", "lease"), cache ("auto", "shared",
    # "node-local"), cache_root (a node-local directory), max_workers ("auto", "off" or an int),
    # wait_timeout (seconds).  With no arguments the hook only logs the policy in force.
    dict(type="SharedFSHook", cache="node-local", wait_timeout=600),
]

# Nothing to change here: with sharedfs every rank may create the work dir and log dir (no
# FileExistsError on NFS), checkpoints and last_checkpoint are published by atomic rename, and
# auto-resume picks one checkpoint on rank 0 that every rank waits to see.
default_hooks = dict(
    checkpoint=dict(type="CheckpointHook", interval=1000, by_epoch=False, max_keep_ckpts=3),
    logger=dict(type="LoggerHook", interval=50),
)
resume = True  # safe on shared filesystems that show other nodes' files late

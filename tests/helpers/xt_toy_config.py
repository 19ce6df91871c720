# A classic (string-typed) mmengine config, as users write them: the hook comes in through
# custom_imports and is named by string.  The launcher (xt_launch.py) sets work_dir and launcher.
custom_imports = dict(imports=["sharedfs.shims.mmengine", "xt_toy"], allow_failed_imports=False)

model = dict(type="XtToyModel")
train_dataloader = dict(
    dataset=dict(type="XtToyDataset"),
    sampler=dict(type="DefaultSampler", shuffle=False),
    collate_fn=dict(type="default_collate"),
    batch_size=4,
    num_workers=0,
)
train_cfg = dict(by_epoch=False, max_iters=4)
optim_wrapper = dict(optimizer=dict(type="SGD", lr=0.01))
default_hooks = dict(
    checkpoint=dict(type="CheckpointHook", interval=2, by_epoch=False),
    logger=dict(type="LoggerHook", interval=1),
)
custom_hooks = [
    # Explicit settings: they must win over SHAREDFS_CACHE / SHAREDFS_WAIT_TIMEOUT in the environment.
    dict(type="SharedFSHook", cache="node-local", wait_timeout=77),
    dict(type="XtProbeHook"),
]
env_cfg = dict(dist_cfg=dict(backend="gloo"))
randomness = dict(seed=0)
log_level = "INFO"

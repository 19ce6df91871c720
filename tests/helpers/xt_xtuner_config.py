# An XTuner 0.2.0 config in XTuner's own pure-Python style (adapted from
# xtuner/configs/llama/llama2_7b/llama2_7b_qlora_alpaca_e3.py), shrunk for a CPU test: a tiny local
# Llama (tests/helpers/xt_tiny_llama.py) fine-tuned on Alpaca-format rows through process_hf_dataset.
# The test renders this file, replacing the two @...@ paths (mmengine imports pure-Python configs
# lazily, so a config cannot read os.environ).
from datasets import load_dataset
from mmengine.dataset import DefaultSampler
from mmengine.hooks import CheckpointHook, IterTimerHook, LoggerHook, ParamSchedulerHook
from mmengine.optim import OptimWrapper
from torch.optim import AdamW
from transformers import AutoModelForCausalLM, AutoTokenizer
from xt_toy import XtProbeHook
from xtuner.dataset import process_hf_dataset
from xtuner.dataset.collate_fns import default_collate_fn
from xtuner.dataset.map_fns import alpaca_map_fn, template_map_fn_factory
from xtuner.engine.runner import TrainLoop
from xtuner.model import SupervisedFinetune
from xtuner.utils import PROMPT_TEMPLATE

from sharedfs.shims.mmengine import SharedFSHook

pretrained_model_name_or_path = "@MODEL_DIR@"
alpaca_path = "@DATA@"
prompt_template = PROMPT_TEMPLATE.default
max_length = 64
pack_to_max_length = True

tokenizer = dict(type=AutoTokenizer.from_pretrained, pretrained_model_name_or_path=pretrained_model_name_or_path,
                 padding_side="right")
model = dict(type=SupervisedFinetune, use_activation_checkpointing=False,
             llm=dict(type=AutoModelForCausalLM.from_pretrained,
                      pretrained_model_name_or_path=pretrained_model_name_or_path))

alpaca_en = dict(
    type=process_hf_dataset,
    dataset=dict(type=load_dataset, path="json", data_files=alpaca_path),
    tokenizer=tokenizer,
    max_length=max_length,
    dataset_map_fn=alpaca_map_fn,
    template_map_fn=dict(type=template_map_fn_factory, template=prompt_template),
    remove_unused_columns=True,
    shuffle_before_pack=True,
    pack_to_max_length=pack_to_max_length,
    map_num_proc=1,
)
train_dataloader = dict(batch_size=1, num_workers=0, dataset=alpaca_en,
                        sampler=dict(type=DefaultSampler, shuffle=True),
                        collate_fn=dict(type=default_collate_fn))

optim_wrapper = dict(type=OptimWrapper, optimizer=dict(type=AdamW, lr=1e-3))
param_scheduler = []
train_cfg = dict(type=TrainLoop, max_iters=3)

custom_hooks = [
    # The pure-Python form: the class itself.  The datasets cache goes to node-local storage for this run.
    dict(type=SharedFSHook, cache="node-local"),
    dict(type=XtProbeHook),
]
default_hooks = dict(
    timer=dict(type=IterTimerHook),
    logger=dict(type=LoggerHook, log_metric_by_epoch=False, interval=1),
    param_scheduler=dict(type=ParamSchedulerHook),
    checkpoint=dict(type=CheckpointHook, by_epoch=False, interval=3, max_keep_ckpts=1),
)
env_cfg = dict(cudnn_benchmark=False, mp_cfg=dict(mp_start_method="fork", opencv_num_threads=0),
               dist_cfg=dict(backend="gloo"))
visualizer = None
log_level = "INFO"
load_from = None
resume = False
randomness = dict(seed=0, deterministic=False)
log_processor = dict(by_epoch=False)

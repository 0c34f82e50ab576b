"""gputrain.optim: fused AdamW, 8-bit AdamW (bitsandbytes' AdamW8bit) and SGD, clipping, schedules,
parameter groups and EMA.

    optimizer = gt.optim.AdamW(gt.optim.param_groups_weight_decay(model, 0.01), lr=3e-3)
    scheduler = gt.optim.get_scheduler("cosine", optimizer, num_warmup_steps=100,
                                       num_training_steps=10_000)
"""

from gputrain.optim.adamw import AdamW
from gputrain.optim.adamw8bit import AdamW8bit
from gputrain.optim.clip import clip_coefficient, clip_grad_norm_, total_norm
from gputrain.optim.ema import EMA
from gputrain.optim.groups import no_weight_decay, param_groups_llrd, param_groups_weight_decay
from gputrain.optim.optimizer import Optimizer
from gputrain.optim.schedule import (
    LambdaLR,
    SchedulerType,
    get_constant_schedule,
    get_constant_schedule_with_warmup,
    get_cosine_schedule_with_warmup,
    get_cosine_with_hard_restarts_schedule_with_warmup,
    get_inverse_sqrt_schedule,
    get_linear_schedule_with_warmup,
    get_polynomial_decay_schedule_with_warmup,
    get_scheduler,
)
from gputrain.optim.sgd import SGD

__all__ = [
    "SGD",
    "EMA",
    "AdamW",
    "AdamW8bit",
    "LambdaLR",
    "Optimizer",
    "SchedulerType",
    "clip_coefficient",
    "clip_grad_norm_",
    "get_constant_schedule",
    "get_constant_schedule_with_warmup",
    "get_cosine_schedule_with_warmup",
    "get_cosine_with_hard_restarts_schedule_with_warmup",
    "get_inverse_sqrt_schedule",
    "get_linear_schedule_with_warmup",
    "get_polynomial_decay_schedule_with_warmup",
    "get_scheduler",
    "no_weight_decay",
    "param_groups_llrd",
    "param_groups_weight_decay",
    "total_norm",
]

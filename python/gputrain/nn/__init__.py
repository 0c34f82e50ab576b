"""gputrain.nn: layers composing into models trained by one C call per step."""

from gputrain.nn.layers import (
    Conv2d,
    GELU,
    Dropout,
    Embedding,
    Flatten,
    LayerNorm,
    Linear,
    MultiheadAttention,
    ReLU,
    Residual,
    Sequential,
    SiLU,
    Tanh,
)
from gputrain.nn.loss import CrossEntropyLoss, MSELoss
from gputrain.nn.module import Module
from gputrain.nn.parameter import Parameter

__all__ = [
    "GELU",
    "Conv2d",
    "CrossEntropyLoss",
    "Dropout",
    "Embedding",
    "Flatten",
    "LayerNorm",
    "Linear",
    "MSELoss",
    "MultiheadAttention",
    "Module",
    "Parameter",
    "ReLU",
    "Residual",
    "Sequential",
    "SiLU",
    "Tanh",
]

"""gputrain.nn: layers composing into models trained by one C call per step."""

from gputrain.nn.layers import (
    Conv2d,
    GELU,
    AdaptiveAvgPool2d,
    AvgPool2d,
    BatchNorm2d,
    Dropout,
    Embedding,
    Flatten,
    LayerNorm,
    Linear,
    MaxPool2d,
    MultiheadAttention,
    ReLU,
    RMSNorm,
    Residual,
    Sequential,
    SiLU,
    Tanh,
)
from gputrain.nn.embedding import PositionEmbedding, TiedLinear
from gputrain.nn.loss import CrossEntropyLoss, MSELoss
from gputrain.nn.module import Module
from gputrain.nn.parameter import Parameter
from gputrain.nn.sequence import SequencePool, TokenEmbedding, pack_inputs

__all__ = [
    "GELU",
    "AdaptiveAvgPool2d",
    "AvgPool2d",
    "BatchNorm2d",
    "Conv2d",
    "CrossEntropyLoss",
    "Dropout",
    "Embedding",
    "Flatten",
    "LayerNorm",
    "Linear",
    "MSELoss",
    "MaxPool2d",
    "MultiheadAttention",
    "Module",
    "Parameter",
    "PositionEmbedding",
    "RMSNorm",
    "ReLU",
    "Residual",
    "Sequential",
    "SequencePool",
    "SiLU",
    "Tanh",
    "TiedLinear",
    "TokenEmbedding",
    "pack_inputs",
]

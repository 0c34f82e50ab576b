"""gputrain.nn: layers composing into models trained by one C call per step."""

from gputrain.nn import layers
from gputrain.nn.layers import *  # noqa: F403  (its __all__: every layer class)
from gputrain.nn.embedding import Bias, PositionEmbedding, TiedLinear
from gputrain.nn.loss import CrossEntropyLoss, MSELoss
from gputrain.nn.module import Module
from gputrain.nn.parameter import Parameter
from gputrain.nn.qlinear import QLinear
from gputrain.nn.sequence import (FrozenTokenEmbedding, HalfTokenEmbedding, QTokenEmbedding, SequencePool,
                                  TokenEmbedding, pack_inputs)

__all__ = [*layers.__all__,
           "Bias",
           "CrossEntropyLoss",
           "FrozenTokenEmbedding",
           "HalfTokenEmbedding",
           "MSELoss",
           "Module",
           "Parameter",
           "PositionEmbedding",
           "QLinear",
           "QTokenEmbedding",
           "SequencePool",
           "TiedLinear",
           "TokenEmbedding",
           "pack_inputs",
           ]

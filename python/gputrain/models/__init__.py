"""gputrain.models: complete models built from gputrain.nn layers."""

from gputrain.models.classifier import TransformerClassifier, encode_pairs, encode_single
from gputrain.models.cnn import SimpleCNN
from gputrain.models.gpt import GPT, GPTConfig

__all__ = ["GPT", "GPTConfig", "SimpleCNN", "TransformerClassifier", "encode_pairs", "encode_single"]

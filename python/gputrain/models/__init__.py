"""gputrain.models: complete models built from gputrain.nn layers."""

from gputrain.models.classifier import TransformerClassifier, encode_pairs, encode_single
from gputrain.models.gpt import GPT, GPTConfig

__all__ = ["GPT", "GPTConfig", "TransformerClassifier", "encode_pairs", "encode_single"]

"""gputrain.models: complete models built from gputrain.nn layers."""

from gputrain.models.classifier import TransformerClassifier, encode_pairs, encode_single
from gputrain.models.cnn import SimpleCNN
from gputrain.models.gpt import GPT, GPTConfig
from gputrain.models.hf import FAMILIES, GPT2LMHeadModel, from_pretrained, save_pretrained

__all__ = ["FAMILIES", "GPT", "GPT2LMHeadModel", "GPTConfig", "SimpleCNN", "TransformerClassifier", "encode_pairs",
           "encode_single", "from_pretrained", "save_pretrained"]

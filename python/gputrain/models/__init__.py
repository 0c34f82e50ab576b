"""gputrain.models: complete models built from gputrain.nn layers."""

from gputrain.models.classifier import TransformerClassifier, encode_pairs, encode_single

__all__ = ["TransformerClassifier", "encode_pairs", "encode_single"]

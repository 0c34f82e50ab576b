"""Layers for language models: learned position embeddings, and a Linear tied to an Embedding's
table (an LM head sharing the token embedding, as GPT-2's)."""

from __future__ import annotations

from gputrain.nn.layers import Embedding, _positive_int
from gputrain.nn.module import Module


class PositionEmbedding(Module):
    """x + weight[:T] for a (..., T, embedding_dim) input: row t of the (num_positions,
    embedding_dim) table is added at position t (GPT-2's ``wpe``, with the token embedding
    before it). T must be at most num_positions. The table starts as Embedding's, N(0, 1)."""

    _param_names = ("weight",)

    def __init__(self, num_positions: int, embedding_dim: int) -> None:
        super().__init__()
        self.num_positions = _positive_int(num_positions, "num_positions")
        self.embedding_dim = _positive_int(embedding_dim, "embedding_dim")
        self._compile()

    def _spec(self) -> tuple:
        return ("position", self.num_positions, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_positions}, {self.embedding_dim}"


class TiedLinear(Module):
    """y = x E^T with E the (num_embeddings, embedding_dim) table of `embedding`, used as a
    Linear's (out_features, in_features) weight without bias: an output layer tied to the input
    embedding (weight tying). It has no parameter of its own: the table is listed once, under the
    embedding's name, and its gradient is the sum of both uses. The embedding must come before
    it in the same model."""

    def __init__(self, embedding: Embedding) -> None:
        super().__init__()
        if not isinstance(embedding, Embedding):
            raise TypeError(f"embedding must be a gputrain.nn.Embedding, not {type(embedding).__name__}")
        self.embedding = embedding
        self.in_features = embedding.embedding_dim
        self.out_features = embedding.num_embeddings

    def _spec_in(self, tied: dict[int, int]) -> tuple:
        if id(self.embedding) not in tied:
            raise ValueError("TiedLinear: its Embedding must be a layer of the same model, placed before it")
        return ("tied_linear", tied[id(self.embedding)])

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, tied to an Embedding"

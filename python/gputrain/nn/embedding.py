"""Layers for language models: learned position embeddings, a Linear tied to an Embedding's
table (an LM head sharing the token embedding, as GPT-2's), and the Bias such a head may add."""

from __future__ import annotations

from gputrain.nn.layers import Embedding, _positive_int
from gputrain.nn.module import Module
from gputrain.nn.sequence import TokenEmbedding


class PositionEmbedding(Module):
    """x + weight[offset:offset + T] for a (..., T, embedding_dim) input: row offset + t of the
    (num_positions, embedding_dim) table is added at position t (GPT-2's ``wpe``, with the token
    embedding before it; RoBERTa's tokens under right padding sit at rows padding_idx + 1 + t:
    offset = padding_idx + 1). T must be at most num_positions - offset. The table starts as
    Embedding's, N(0, 1)."""

    _param_names = ("weight",)

    def __init__(self, num_positions: int, embedding_dim: int, offset: int = 0) -> None:
        super().__init__()
        self.num_positions = _positive_int(num_positions, "num_positions")
        self.embedding_dim = _positive_int(embedding_dim, "embedding_dim")
        if isinstance(offset, bool) or not isinstance(offset, int):
            raise TypeError(f"offset must be an int, not {type(offset).__name__}")
        if not 0 <= offset < self.num_positions:
            raise ValueError(f"offset must be in [0, num_positions) = [0, {self.num_positions}), got {offset}")
        self.offset = offset
        self._compile()

    def _spec(self) -> tuple:
        return ("position", self.num_positions, self.embedding_dim, self.offset)

    def extra_repr(self) -> str:
        return f"{self.num_positions}, {self.embedding_dim}" + (f", offset={self.offset}" if self.offset else "")


class TiedLinear(Module):
    """y = x E^T with E the (num_embeddings, embedding_dim) table of `embedding`, used as a
    Linear's (out_features, in_features) weight without bias: an output layer tied to the input
    embedding (weight tying). It has no parameter of its own: the table is listed once, under the
    embedding's name, and its gradient is the sum of both uses. The embedding (an Embedding, or a
    TokenEmbedding whose token rows, not its token-type rows, are E) must come before it in the
    same model. A HalfTokenEmbedding's frozen bf16/f16 table is read as stored (what gputrain.peft
    makes of a bf16 model's tied table): no gradient, and the model must compute in that precision;
    a QTokenEmbedding's 4-bit table is refused."""

    def __init__(self, embedding: Embedding | TokenEmbedding) -> None:
        super().__init__()
        if isinstance(embedding, TokenEmbedding) and embedding.stored_dtype not in ("f32", "bf16", "f16"):
            raise ValueError(f"embedding: a {type(embedding).__name__} holds its table in {embedding.stored_dtype} "
                             "alone; a TiedLinear reads a float32 table or a half one (HalfTokenEmbedding)")
        if not isinstance(embedding, (Embedding, TokenEmbedding)):
            raise TypeError(f"embedding must be a gputrain.nn.Embedding or TokenEmbedding, not "
                            f"{type(embedding).__name__}")
        self.embedding = embedding
        self.in_features = embedding.embedding_dim
        self.out_features = embedding.num_embeddings

    def _spec_in(self, tied: dict[int, int]) -> tuple:
        if id(self.embedding) not in tied:
            raise ValueError("TiedLinear: its Embedding must be a layer of the same model, placed before it")
        return ("tied_linear", tied[id(self.embedding)])

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, tied to an Embedding"


class Bias(Module):
    """y = x + bias over the last dim of a (..., features) input, ``bias`` (features,) starting
    at 0: the output bias of an LM head tied to the token embedding (BERT's
    ``cls.predictions.bias``, after a TiedLinear)."""

    _param_names = ("bias",)

    def __init__(self, features: int) -> None:
        super().__init__()
        self.features = _positive_int(features, "features")
        self._compile()

    def _spec(self) -> tuple:
        return ("bias", self.features)

    def extra_repr(self) -> str:
        return f"{self.features}"

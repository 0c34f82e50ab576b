"""TransformerClassifier: a bidirectional (BERT-style, pre-LayerNorm) encoder with a
classification head, for single sentences and sentence pairs, and the helpers that encode them.

    enc = gt.models.encode_pairs(premises, hypotheses, max_len=64, cls_id=1, sep_id=2)
    model = gt.models.TransformerClassifier(vocab_size=1000, num_classes=3, max_len=64)
    logits = model(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
    trainer = gt.Trainer(model, args, train_dataset={**enc, "labels": labels})

The model's C input is one int64 array (batch, 3, seq): token ids, token type ids and the
attention mask (gputrain.nn.pack_inputs, which ``model.pack`` calls), so loaders, shuffling and
gradient accumulation carry the mask with the tokens. Padded positions are masked as keys in
every attention layer and left out of the pooling, so a sequence's logits and gradients do not
depend on how much padding its batch has.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from gputrain.nn.layers import (
    GELU, Dropout, LayerNorm, Linear, MultiheadAttention, Residual, Sequential, _positive_int,
)
from gputrain.nn.module import Module
from gputrain.nn.embedding import PositionEmbedding
from gputrain.nn.sequence import SequencePool, TokenEmbedding, pack_inputs


class TransformerClassifier(Module):
    """Token (+ token type) and learned position embeddings, dropout, ``num_layers`` pre-LN encoder
    blocks (x + Attention(LN(x)), then x + MLP(LN(x)) with a GELU MLP of ``ff_dim``), a final
    LayerNorm, pooling (``"cls"``: the first token; ``"mean"``: the mean over the real tokens),
    dropout and a Linear head to ``num_classes`` logits.

    state_dict: ``embeddings.weight`` (vocab_size + type_vocab_size, d_model: token rows, then
    token type rows), ``positions.weight`` (max_len, d_model), ``blocks.{i}.0.block.0`` (LN),
    ``blocks.{i}.0.block.1`` (MultiheadAttention), ``blocks.{i}.1.block.{0,1,3}`` (LN, Linear,
    Linear), ``norm``, ``head``."""

    def __init__(self, vocab_size: int, num_classes: int, max_len: int = 128, d_model: int = 128,
                 num_layers: int = 2, num_heads: int = 4, ff_dim: int | None = None, dropout: float = 0.1,
                 pooling: str = "cls", type_vocab_size: int = 2, layer_norm_eps: float = 1e-5) -> None:
        super().__init__()
        self.vocab_size = _positive_int(vocab_size, "vocab_size")
        self.num_classes = _positive_int(num_classes, "num_classes")
        self.max_len = _positive_int(max_len, "max_len")
        self.d_model = _positive_int(d_model, "d_model")
        self.num_layers = _positive_int(num_layers, "num_layers")
        ff_dim = 4 * self.d_model if ff_dim is None else _positive_int(ff_dim, "ff_dim")
        if pooling not in ("cls", "mean"):
            raise ValueError(f"pooling must be 'cls' or 'mean', got {pooling!r}")
        self.pooling = pooling
        self.embeddings = TokenEmbedding(self.vocab_size, self.d_model, type_vocab_size, attention_mask=True)
        self.positions = PositionEmbedding(self.max_len, self.d_model)
        self.embed_dropout = Dropout(dropout)
        self.blocks = Sequential(*(self._block(num_heads, ff_dim, dropout, layer_norm_eps)
                                   for _ in range(self.num_layers)))
        self.norm = LayerNorm(self.d_model, eps=layer_norm_eps)
        self.pool = SequencePool(pooling)
        self.head_dropout = Dropout(dropout)
        self.head = Linear(self.d_model, self.num_classes)
        self._compile()

    def _block(self, num_heads: int, ff_dim: int, dropout: float, eps: float) -> Sequential:
        d = self.d_model
        attention = Residual(LayerNorm(d, eps=eps), MultiheadAttention(d, num_heads, dropout=dropout), Dropout(dropout))
        mlp = Residual(LayerNorm(d, eps=eps), Linear(d, ff_dim), GELU(), Linear(ff_dim, d), Dropout(dropout))
        return Sequential(attention, mlp)

    def named_children(self) -> Iterator[tuple[str, Module]]:
        return iter((("embeddings", self.embeddings), ("positions", self.positions),
                     ("embed_dropout", self.embed_dropout), ("blocks", self.blocks), ("norm", self.norm),
                     ("pool", self.pool), ("head_dropout", self.head_dropout), ("head", self.head)))

    def _spec_in(self, tied: dict[int, int]) -> tuple:
        return ("sequential", [child._spec_in(tied) for _, child in self.named_children()])

    @property
    def type_vocab_size(self) -> int:
        """Token types the embedding knows (token_type_ids must be below it)."""
        return self.embeddings.type_vocab_size

    def pack(self, input_ids: Any, attention_mask: Any = None, token_type_ids: Any = None) -> np.ndarray:
        """The (batch, channels, seq) int64 input rows of this model: a missing attention_mask
        means no padding, missing token_type_ids all type 0. Checked (ValueError naming the
        argument): 2-D integer arrays of one shape, seq <= max_len, the mask 0/1 with ones first."""
        ids = np.asarray(input_ids)
        if ids.ndim != 2:
            raise ValueError(f"input_ids must be (batch, seq), got shape {ids.shape}")
        if ids.shape[1] > self.max_len:
            raise ValueError(f"input_ids: sequences of {ids.shape[1]} tokens are longer than max_len={self.max_len}")
        if attention_mask is None:
            attention_mask = np.ones(ids.shape, np.int64)
        if token_type_ids is None and self.type_vocab_size > 0:
            token_type_ids = np.zeros(ids.shape, np.int64)
        if token_type_ids is not None and self.type_vocab_size == 0:
            raise ValueError("token_type_ids: this model has type_vocab_size=0")
        return pack_inputs(ids, attention_mask, token_type_ids)

    def __call__(self, input_ids: Any, attention_mask: Any = None, token_type_ids: Any = None) -> np.ndarray:
        """Logits (batch, num_classes) for input_ids (batch, seq) with the optional mask and token
        types, or for rows already packed (batch, channels, seq) (what the Trainer passes)."""
        if np.ndim(input_ids) == 3 and attention_mask is None and token_type_ids is None:
            return self.compiled.forward(input_ids)
        return self.compiled.forward(self.pack(input_ids, attention_mask, token_type_ids))

    def extra_repr(self) -> str:
        return (f"vocab_size={self.vocab_size}, num_classes={self.num_classes}, max_len={self.max_len}, "
                f"d_model={self.d_model}, num_layers={self.num_layers}, pooling={self.pooling!r}")


def _truncate_pair(a: list[int], b: list[int], budget: int) -> tuple[list[int], list[int]]:
    """Hugging Face's "longest_first": drop the last token of the longer sequence (the first on
    a tie) until both fit in `budget` tokens."""
    a, b = list(a), list(b)
    while len(a) + len(b) > budget:
        if len(a) >= len(b):
            a.pop()
        else:
            b.pop()
    return a, b


def _check_ids(name: str, sequences: Sequence[Sequence[int]]) -> list[list[int]]:
    out = []
    for i, seq in enumerate(sequences):
        values = [int(v) for v in seq]
        if any(v < 0 for v in values):
            raise ValueError(f"{name}[{i}]: token ids must be >= 0")
        out.append(values)
    return out


def _encode(rows: list[tuple[list[int], list[int]]], max_len: int, pad_id: int) -> dict[str, np.ndarray]:
    n = len(rows)
    input_ids = np.full((n, max_len), pad_id, np.int64)
    token_type_ids = np.zeros((n, max_len), np.int64)
    attention_mask = np.zeros((n, max_len), np.int64)
    for i, (tokens, types) in enumerate(rows):
        input_ids[i, :len(tokens)] = tokens
        token_type_ids[i, :len(types)] = types
        attention_mask[i, :len(tokens)] = 1
    return {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask}


def encode_pairs(first: Sequence[Sequence[int]], second: Sequence[Sequence[int]], max_len: int, cls_id: int,
                 sep_id: int, pad_id: int = 0) -> dict[str, np.ndarray]:
    """Sentence pairs as ``[CLS] a [SEP] b [SEP]``, truncated longest-first to max_len and padded on
    the right with pad_id: {"input_ids", "token_type_ids" (0 for [CLS] a [SEP], 1 for b [SEP]),
    "attention_mask"}, each int64 (n, max_len)."""
    max_len = _positive_int(max_len, "max_len")
    if max_len < 5:
        raise ValueError(f"max_len must be >= 5 for a pair ([CLS] a [SEP] b [SEP]), got {max_len}")
    if len(first) != len(second):
        raise ValueError(f"second: expected {len(first)} sequences (as first), got {len(second)}")
    rows = []
    for a, b in zip(_check_ids("first", first), _check_ids("second", second)):
        a, b = _truncate_pair(a, b, max_len - 3)
        rows.append(([cls_id, *a, sep_id, *b, sep_id], [0] * (len(a) + 2) + [1] * (len(b) + 1)))
    return _encode(rows, max_len, pad_id)


def encode_single(sequences: Sequence[Sequence[int]], max_len: int, cls_id: int, sep_id: int,
                  pad_id: int = 0) -> dict[str, np.ndarray]:
    """Single sentences as ``[CLS] a [SEP]``, truncated to max_len and padded on the right: the
    dict of encode_pairs (token types all 0)."""
    max_len = _positive_int(max_len, "max_len")
    if max_len < 3:
        raise ValueError(f"max_len must be >= 3 for [CLS] a [SEP], got {max_len}")
    rows = []
    for a in _check_ids("sequences", sequences):
        a = a[:max_len - 2]
        rows.append(([cls_id, *a, sep_id], [0] * (len(a) + 2)))
    return _encode(rows, max_len, pad_id)

"""The ends of a sequence encoder: token (+ token type) embeddings that read the attention mask,
learned position embeddings, and pooling over the sequence.

A model whose first layer is a ``TokenEmbedding(..., attention_mask=True)`` takes int64 input rows
``(batch, channels, seq)``: channel 0 the token ids, then the token type ids (when
``type_vocab_size > 0``), then the 0/1 attention mask (ones first, as tokenizers give; see
:func:`pack_inputs`). The layer counts each sequence's ones, and every ``MultiheadAttention`` and
``SequencePool`` of the model masks the keys after them: a padded position is never attended to
and never pooled, so the real tokens' outputs, loss and gradients do not depend on the padding.
The mask travels inside the input rows, so DataLoaders, shuffling, gradient accumulation and the
Trainer carry it with no extra argument.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gputrain.nn.layers import _positive_int
from gputrain.nn.module import Module


class TokenEmbedding(Module):
    """out[b, t] = weight[ids[b, t]] (+ weight[num_embeddings + token_type_ids[b, t]]).

    ``weight`` is ``(num_embeddings + type_vocab_size, embedding_dim)``: the token rows, then the
    token type (segment) rows. Initialised N(0, 1) as ``nn.Embedding``. The input is int64
    ``(batch, channels, seq)`` (see the module docstring and :func:`pack_inputs`)."""

    _param_names = ("weight",)

    def __init__(self, num_embeddings: int, embedding_dim: int, type_vocab_size: int = 0,
                 attention_mask: bool = False) -> None:
        super().__init__()
        self.num_embeddings = _positive_int(num_embeddings, "num_embeddings")
        self.embedding_dim = _positive_int(embedding_dim, "embedding_dim")
        if isinstance(type_vocab_size, bool) or not isinstance(type_vocab_size, int):
            raise TypeError(f"type_vocab_size must be an int, not {type(type_vocab_size).__name__}")
        if type_vocab_size < 0:
            raise ValueError(f"type_vocab_size must be >= 0, got {type_vocab_size}")
        self.type_vocab_size = type_vocab_size
        self.attention_mask = bool(attention_mask)
        self._compile()

    @property
    def channels(self) -> int:
        """Rows of ids per sequence in the input: tokens, token types, attention mask."""
        return 1 + (self.type_vocab_size > 0) + self.attention_mask

    def _spec(self) -> tuple:
        return ("tokens", self.num_embeddings, self.embedding_dim, self.type_vocab_size, self.attention_mask)

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim}, type_vocab_size={self.type_vocab_size}, "
                f"attention_mask={self.attention_mask}")


class SequencePool(Module):
    """(batch, seq, dim) -> (batch, dim): ``mode="cls"`` takes the first token, ``mode="mean"``
    averages the positions the attention mask keeps (all of them in a model without a mask)."""

    def __init__(self, mode: str = "cls") -> None:
        super().__init__()
        if mode not in ("cls", "mean"):
            raise ValueError(f"mode must be 'cls' or 'mean', got {mode!r}")
        self.mode = mode

    def _spec(self) -> tuple:
        return ("pool", self.mode)

    def extra_repr(self) -> str:
        return f"mode={self.mode!r}"


def _int_matrix(value: Any, name: str, shape: tuple[int, int] | None) -> np.ndarray:
    array = np.asarray(value)
    if array.dtype == bool:
        array = array.astype(np.int64)
    if array.ndim != 2 or not (np.issubdtype(array.dtype, np.integer)):
        raise ValueError(f"{name} must be a 2-D integer array (batch, seq), got dtype {array.dtype} and "
                         f"shape {array.shape}")
    if shape is not None and array.shape != shape:
        raise ValueError(f"{name} must have the shape of input_ids {shape}, got {array.shape}")
    return array.astype(np.int64, copy=False)


def check_attention_mask(attention_mask: Any, shape: tuple[int, int] | None = None) -> np.ndarray:
    """The mask as int64 (batch, seq), checked: only 0s and 1s, each row's ones a prefix (padding
    on the right) and at least one; ValueError naming ``attention_mask`` otherwise."""
    mask = _int_matrix(attention_mask, "attention_mask", shape)
    if mask.size and not np.isin(mask, (0, 1)).all():
        raise ValueError("attention_mask must hold only 0 and 1")
    lengths = mask.sum(axis=1)
    if (lengths == 0).any():
        row = int(np.flatnonzero(lengths == 0)[0])
        raise ValueError(f"attention_mask: row {row} has no 1: every sequence needs at least one key")
    prefix = np.arange(mask.shape[1])[None, :] < lengths[:, None]
    if not np.array_equal(mask.astype(bool), prefix):
        row = int(np.flatnonzero((mask.astype(bool) != prefix).any(axis=1))[0])
        raise ValueError(f"attention_mask: row {row} is not ones followed by zeros (gputrain masks "
                         "right-padded sequences)")
    return mask


def pack_inputs(input_ids: Any, attention_mask: Any = None, token_type_ids: Any = None) -> np.ndarray:
    """The int64 ``(batch, channels, seq)`` rows a TokenEmbedding reads: input_ids, then
    token_type_ids, then attention_mask, each (batch, seq) and given only when the layer reads it.
    The mask is checked (:func:`check_attention_mask`)."""
    ids = _int_matrix(input_ids, "input_ids", None)
    rows = [ids]
    if token_type_ids is not None:
        rows.append(_int_matrix(token_type_ids, "token_type_ids", ids.shape))
    if attention_mask is not None:
        rows.append(check_attention_mask(attention_mask, ids.shape))
    return np.ascontiguousarray(np.stack(rows, axis=1))


def _first_leaf(model: Module) -> Module:
    for _, child in model.named_children():
        return _first_leaf(child)
    return model


def pack_for(model: Module, input_ids: Any, attention_mask: Any = None, token_type_ids: Any = None) -> np.ndarray:
    """:func:`pack_inputs` for `model`, whose first layer must be a TokenEmbedding reading
    exactly the given inputs (ValueError naming the argument otherwise)."""
    first = _first_leaf(model)
    if not isinstance(first, TokenEmbedding):
        name = "attention_mask" if attention_mask is not None else "token_type_ids"
        raise ValueError(f"{name}: {type(model).__name__} does not read it: a model takes an attention mask "
                         "or token types through a first layer TokenEmbedding(..., attention_mask=True, "
                         "type_vocab_size=...)")
    if (attention_mask is not None) != first.attention_mask:
        raise ValueError("attention_mask: " + ("required: the model's TokenEmbedding reads a mask" if first.attention_mask
                                               else "the model's TokenEmbedding has attention_mask=False"))
    if (token_type_ids is not None) != (first.type_vocab_size > 0):
        raise ValueError("token_type_ids: " + ("required: the model's TokenEmbedding has token types"
                                               if first.type_vocab_size else
                                               "the model's TokenEmbedding has type_vocab_size=0"))
    return pack_inputs(input_ids, attention_mask, token_type_ids)

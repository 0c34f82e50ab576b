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

from gputrain._cast import widen
from gputrain.nn.layers import _positive_int
from gputrain.nn.module import Module, planning_active
from gputrain.nn.qlinear import QUANT_TYPES_4BIT
from gputrain.quant import BLOCKSIZES_4BIT, QuantState, dequantize_4bit, quantize_4bit
from gputrain.quant.codes import code_table


class TokenEmbedding(Module):
    """out[b, t] = weight[ids[b, t]] (+ weight[num_embeddings + token_type_ids[b, t]]).

    ``weight`` is ``(num_embeddings + type_vocab_size, embedding_dim)``: the token rows, then the
    token type (segment) rows. Initialised N(0, 1) as ``nn.Embedding``. The input is int64
    ``(batch, channels, seq)`` (see the module docstring and :func:`pack_inputs`)."""

    _param_names = ("weight",)
    stored_dtype = "f32"  # the table is a float32 parameter (HalfTokenEmbedding, QTokenEmbedding: frozen buffers)
    blocksize = 0  # a 4-bit table's absmax block (QTokenEmbedding); 0: none

    def __init__(self, num_embeddings: int, embedding_dim: int, type_vocab_size: int = 0,
                 attention_mask: bool = False, *, position_ids: bool = False,
                 pad_token_id: int | None = None) -> None:
        super().__init__()
        self.num_embeddings = _positive_int(num_embeddings, "num_embeddings")
        self.embedding_dim = _positive_int(embedding_dim, "embedding_dim")
        if isinstance(type_vocab_size, bool) or not isinstance(type_vocab_size, int):
            raise TypeError(f"type_vocab_size must be an int, not {type(type_vocab_size).__name__}")
        if type_vocab_size < 0:
            raise ValueError(f"type_vocab_size must be >= 0, got {type_vocab_size}")
        self.type_vocab_size = type_vocab_size
        self.attention_mask = bool(attention_mask)
        self.position_ids = bool(position_ids)
        if self.position_ids and not self.attention_mask:
            raise ValueError("position_ids=True needs attention_mask=True (a row's segments come from both)")
        if pad_token_id is not None:
            if isinstance(pad_token_id, bool) or not isinstance(pad_token_id, (int, np.integer)):
                raise TypeError(f"pad_token_id must be an int or None, not {type(pad_token_id).__name__}")
            if pad_token_id < 0:
                raise ValueError(f"pad_token_id must be >= 0 or None, got {pad_token_id}")
            pad_token_id = int(pad_token_id)
        self.pad_token_id = pad_token_id
        self._compile()

    @property
    def channels(self) -> int:
        """Rows of ids per sequence in the input: tokens, token types, attention mask, position ids."""
        return 1 + (self.type_vocab_size > 0) + self.attention_mask + self.position_ids

    def _spec(self) -> tuple:
        return ("tokens", self.num_embeddings, self.embedding_dim, self.type_vocab_size, self.attention_mask,
                self.position_ids, -1 if self.pad_token_id is None else self.pad_token_id, self.stored_dtype,
                self.blocksize)

    def extra_repr(self) -> str:
        text = (f"{self.num_embeddings}, {self.embedding_dim}, type_vocab_size={self.type_vocab_size}, "
                f"attention_mask={self.attention_mask}")
        if self.position_ids:
            text += ", position_ids=True"
        if self.pad_token_id is not None:
            text += f", pad_token_id={self.pad_token_id}"
        return text


class FrozenTokenEmbedding(TokenEmbedding):
    """A TokenEmbedding whose table is a frozen buffer held compactly, with no float32 master and no
    gradient (HalfTokenEmbedding, QTokenEmbedding). Each subclass gives the table as float32, what
    its lookup reads exactly, as ``table()``."""

    _param_names = ()

    def _spec_in(self, tied: dict[int, int]) -> tuple:
        # numbered, and a reuse named, as a module with parameters (the C spec numbers every
        # TokenEmbedding so), so that a TiedLinear after it names it
        if id(self) in tied:
            return ("tied", tied[id(self)])
        tied[id(self)] = len(tied)
        return self._spec()

    def requires_grad_(self, requires_grad: bool = True) -> FrozenTokenEmbedding:
        """The stored table is frozen: True is refused."""
        if requires_grad:
            raise ValueError(f"{self!r}: the table held in {self.stored_dtype} alone is frozen (it has no "
                             "gradient); train a TokenEmbedding with its float32 table instead")
        return self


class HalfTokenEmbedding(FrozenTokenEmbedding):
    """A TokenEmbedding whose table is frozen and held in bf16 or f16 alone: the buffer ``weight``
    (num_embeddings + type_vocab_size, embedding_dim), 2 bytes an element, with no float32 master
    and no gradient -- what gputrain.peft gives the untied token embedding of a bf16/f16 model (PEFT
    keeps it in the model's dtype). The lookup widens the rows it reads, exactly, so in its own
    precision a model computes what it computed with the float32 table rounded to it. A TiedLinear
    reads it as stored (a tied LM head's GEMMs in that precision, no gradient)."""

    _buffer_names = ("weight",)

    def __init__(self, num_embeddings: int, embedding_dim: int, type_vocab_size: int = 0,
                 attention_mask: bool = False, *, position_ids: bool = False, pad_token_id: int | None = None,
                 stored_dtype: str = "bf16") -> None:
        if stored_dtype not in ("bf16", "f16"):
            raise ValueError(f"stored_dtype must be 'bf16' or 'f16', got {stored_dtype!r}")
        self.stored_dtype = stored_dtype  # read by _spec when the base class compiles
        super().__init__(num_embeddings, embedding_dim, type_vocab_size, attention_mask, position_ids=position_ids,
                         pad_token_id=pad_token_id)

    @classmethod
    def from_token_embedding(cls, layer: TokenEmbedding, stored_dtype: str) -> HalfTokenEmbedding:
        """`layer`'s configuration and table, rounded to nearest even into `stored_dtype` (under
        gputrain.memory_plan.planning(): the configuration only)."""
        half = cls(layer.num_embeddings, layer.embedding_dim, layer.type_vocab_size, layer.attention_mask,
                   position_ids=layer.position_ids, pad_token_id=layer.pad_token_id, stored_dtype=stored_dtype)
        if not planning_active():
            half.load_state_dict({"weight": layer.weight.data}, strict=False)
        return half

    def table(self) -> np.ndarray:
        """The table as float32 (its stored values, exactly)."""
        return widen(np.asarray(self.weight))

    def extra_repr(self) -> str:
        return super().extra_repr() + f", stored_dtype={self.stored_dtype!r}"


class QTokenEmbedding(FrozenTokenEmbedding):
    """A TokenEmbedding whose table is frozen and quantized in 4 bits, in bitsandbytes' layout (a
    Params4bit's, as QLinear's weight): NF4 or FP4 codes of the flattened (num_embeddings +
    type_vocab_size, embedding_dim) table, two a byte (the buffer ``weight``, shape (rows * embedding_dim / 2, 1) uint8, the packed
    shape of a Params4bit) and one float32 absmax per block of `blocksize` elements
    (``weight.absmax``): half a byte an element, with no float32 master and no gradient.
    embedding_dim must be a multiple of blocksize, so a row is whole blocks. The lookup dequantizes
    the rows it reads (code * absmax, rounded once to the compute dtype, as QLinear dequantizes):
    the model computes what it computed with :meth:`table` in a float32 TokenEmbedding (fp32:
    the same bits; bf16/f16: the same values rounded once). A new layer's table is 0 until
    :meth:`quantize_` writes it."""

    _buffer_names = ("weight", "weight.absmax")

    def __init__(self, num_embeddings: int, embedding_dim: int, type_vocab_size: int = 0,
                 attention_mask: bool = False, *, position_ids: bool = False, pad_token_id: int | None = None,
                 quant_type: str = "nf4", blocksize: int = 64) -> None:
        if quant_type not in QUANT_TYPES_4BIT:
            raise ValueError(f"quant_type must be one of {QUANT_TYPES_4BIT} (a 4-bit table), got {quant_type!r}")
        if isinstance(blocksize, bool) or not isinstance(blocksize, int) or blocksize not in BLOCKSIZES_4BIT:
            raise ValueError(f"blocksize must be one of {BLOCKSIZES_4BIT} (bitsandbytes' 4-bit block sizes), "
                             f"got {blocksize!r}")
        if isinstance(embedding_dim, int) and not isinstance(embedding_dim, bool) and embedding_dim % blocksize:
            raise ValueError(f"embedding_dim {embedding_dim} is not a multiple of blocksize {blocksize} (a 4-bit "
                             "table's rows are whole blocks); pick a blocksize that divides it")
        self.stored_dtype = quant_type  # read by _spec when the base class compiles
        self.blocksize = blocksize
        super().__init__(num_embeddings, embedding_dim, type_vocab_size, attention_mask, position_ids=position_ids,
                         pad_token_id=pad_token_id)

    @property
    def quant_type(self) -> str:
        """'nf4' or 'fp4'."""
        return self.stored_dtype

    @property
    def shape(self) -> tuple[int, int]:
        """The table's shape: (num_embeddings + type_vocab_size, embedding_dim)."""
        return (self.num_embeddings + self.type_vocab_size, self.embedding_dim)

    @classmethod
    def from_token_embedding(cls, layer: TokenEmbedding, quant_type: str = "nf4",
                             blocksize: int = 64) -> QTokenEmbedding:
        """`layer`'s configuration and its table quantized (under gputrain.memory_plan.planning():
        the configuration only)."""
        q = cls(layer.num_embeddings, layer.embedding_dim, layer.type_vocab_size, layer.attention_mask,
                position_ids=layer.position_ids, pad_token_id=layer.pad_token_id, quant_type=quant_type,
                blocksize=blocksize)
        if not planning_active():
            q.quantize_(layer.weight.data)
        return q

    def quant_state(self) -> QuantState:
        """The table's QuantState (float32 absmax, no double quantization)."""
        absmax = np.asarray(getattr(self, "weight.absmax"), np.float32).copy()
        return QuantState(self.quant_type, self.blocksize, self.shape, "f32", absmax, code_table(self.quant_type))

    def quantize_(self, table: Any) -> QTokenEmbedding:
        """Quantizes a float32/float16/bfloat16 table of shape (num_embeddings + type_vocab_size,
        embedding_dim) into this layer (gputrain.quant.quantize_4bit: bitsandbytes' codes, bit for
        bit)."""
        if np.shape(table) != self.shape:
            raise ValueError(f"table: expected shape {self.shape}, got {np.shape(table)}")
        table = table if isinstance(table, np.ndarray) else np.asarray(table, np.float32)
        packed, state = quantize_4bit(table, self.blocksize, self.quant_type)
        self.load_state_dict({"weight": packed, "weight.absmax": state.absmax}, strict=False)
        return self

    def table(self) -> np.ndarray:
        """The table as float32 (code * absmax per element)."""
        return dequantize_4bit(np.asarray(self.weight), self.quant_state())

    def extra_repr(self) -> str:
        return super().extra_repr() + f", quant_type={self.quant_type!r}, blocksize={self.blocksize}"


class SequencePool(Module):
    """(batch, seq, dim) -> (batch, dim): ``mode="cls"`` takes the first token, ``mode="mean"``
    averages the positions the attention mask keeps (all of them in a model without a mask),
    ``mode="last"`` takes each row's last token that is not padding (the rightmost id other than
    the model's ``TokenEmbedding(..., pad_token_id=...)``, 0 when all are padding: Hugging Face's
    ...ForSequenceClassification rule; the last position without a pad_token_id)."""

    def __init__(self, mode: str = "cls") -> None:
        super().__init__()
        if mode not in ("cls", "mean", "last"):
            raise ValueError(f"mode must be 'cls', 'mean' or 'last', got {mode!r}")
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


def check_decoder_mask(attention_mask: Any, shape: tuple[int, int]) -> np.ndarray:
    """A decoder's mask as int64 (batch, seq): only 0s and 1s, anywhere (left or right padding,
    packed rows, rows of padding only); ValueError naming ``attention_mask`` otherwise."""
    mask = _int_matrix(attention_mask, "attention_mask", shape)
    if mask.size and not np.isin(mask, (0, 1)).all():
        bad = mask[~np.isin(mask, (0, 1))][0]
        raise ValueError(f"attention_mask must hold only 0 and 1, got {bad}")
    return mask


def check_position_ids(position_ids: Any, shape: tuple[int, int]) -> np.ndarray:
    """Position ids as int64 (batch, seq), each >= 0; ValueError naming ``position_ids`` otherwise."""
    positions = _int_matrix(position_ids, "position_ids", shape)
    if positions.size and positions.min() < 0:
        raise ValueError(f"position_ids must be >= 0, got {positions.min()}")
    return positions


def pack_decoder_inputs(input_ids: Any, attention_mask: Any = None, position_ids: Any = None) -> np.ndarray:
    """The int64 ``(batch, 3, seq)`` rows a ``TokenEmbedding(..., attention_mask=True,
    position_ids=True)`` reads: input_ids, attention_mask (None: ones), position_ids (None:
    ``arange(seq)`` in every row, Hugging Face's default). A new document of a packed row starts
    where its position ids restart at 0."""
    ids = _int_matrix(input_ids, "input_ids", None)
    mask = np.ones_like(ids) if attention_mask is None else check_decoder_mask(attention_mask, ids.shape)
    if position_ids is None:
        positions = np.broadcast_to(np.arange(ids.shape[1], dtype=np.int64), ids.shape)
    else:
        positions = check_position_ids(position_ids, ids.shape)
    return np.ascontiguousarray(np.stack([ids, mask, positions], axis=1))


def needs_packing(model: Module, x: Any) -> bool:
    """True when `model` reads decoder rows (a first TokenEmbedding with position_ids) and x is
    (batch, seq) input_ids rather than packed rows."""
    first = _first_leaf(model)
    return isinstance(first, TokenEmbedding) and first.position_ids and isinstance(x, (np.ndarray, list)) and \
        np.ndim(x) == 2


def _first_leaf(model: Module) -> Module:
    for _, child in model.named_children():
        return _first_leaf(child)
    return model


def pack_for(model: Module, input_ids: Any, attention_mask: Any = None, token_type_ids: Any = None,
             position_ids: Any = None) -> np.ndarray:
    """:func:`pack_inputs` for `model`, whose first layer must be a TokenEmbedding reading
    exactly the given inputs (ValueError naming the argument otherwise); for a decoder's
    (``position_ids=True``), :func:`pack_decoder_inputs`, the mask and positions optional."""
    first = _first_leaf(model)
    if not isinstance(first, TokenEmbedding):
        name = ("attention_mask" if attention_mask is not None else
                "position_ids" if position_ids is not None else "token_type_ids")
        raise ValueError(f"{name}: {type(model).__name__} does not read it: a model takes an attention mask, "
                         "token types or position ids through a first layer TokenEmbedding(..., "
                         "attention_mask=True, type_vocab_size=..., position_ids=...)")
    if first.position_ids:
        if token_type_ids is not None:
            raise ValueError("token_type_ids: the model's TokenEmbedding (position_ids=True) has no token types")
        if np.ndim(input_ids) != 2:
            raise ValueError(f"input_ids must be 2-D (batch, seq), got {np.ndim(input_ids)} dimensions")
        return pack_decoder_inputs(input_ids, attention_mask, position_ids)
    if position_ids is not None:
        raise ValueError("position_ids: the model's TokenEmbedding has position_ids=False")
    if (attention_mask is not None) != first.attention_mask:
        raise ValueError("attention_mask: " + ("required: the model's TokenEmbedding reads a mask" if first.attention_mask
                                               else "the model's TokenEmbedding has attention_mask=False"))
    if (token_type_ids is not None) != (first.type_vocab_size > 0):
        raise ValueError("token_type_ids: " + ("required: the model's TokenEmbedding has token types"
                                               if first.type_vocab_size else
                                               "the model's TokenEmbedding has type_vocab_size=0"))
    return pack_inputs(input_ids, attention_mask, token_type_ids)

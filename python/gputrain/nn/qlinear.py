"""QLinear: a Linear whose weight is frozen and stored compactly: quantized (QLoRA's base layers)
or in half precision alone (a LoRA base in a bf16/f16 model, with no float32 master copy).

The weight is held as bitsandbytes' Linear4bit holds it -- NF4 or FP4 codes packed two per byte
(the buffer ``weight``, uint8 of shape (ceil(out * in / 2), 1)) and one float32 absmax per block of
``blocksize`` elements of the flattened weight (``weight.absmax``) -- or, quant_type "int8", as
its Linear8bitLt holds it (LLM.int8's row-wise format: ``weight`` int8 of shape (out, in) and one
float32 absmax per row, bitsandbytes' ``SCB``, as ``weight.absmax``), or, quant_type "bf16" /
"f16", as the (out, in) bfloat16 / float16 ``weight`` alone (ml_dtypes' bfloat16, or its uint16
bit patterns without ml_dtypes, as gputrain.cast returns bf16), in the model's buffer
arena, so it is never optimised and has no gradient; the C layer (csrc/nn/qlinear.c)
dequantizes blocks of rows into a tile in the compute dtype and runs the backend's GEMM on it, so
the whole weight never exists dequantized (a half weight in its own compute dtype is read as it
is, with no tile). Backward computes the input gradient only. The bias,
if any, is an ordinary trainable Parameter.

An int8 weight is dequantized as bitsandbytes' CPU training path (MatMul8bitFp) does, code *
float32(absmax * float32(1 / 127)), and the GEMM runs in the compute dtype: a weight-only int8
layer. (bitsandbytes' CUDA LLM.int8 also quantizes the activations and splits out outlier
columns; its logits differ from these by that error.)

Codes come from :mod:`gputrain.quant` (bit-exact with bitsandbytes): :meth:`QLinear.quantize_`
quantizes a float weight, :meth:`QLinear.load_quantized` takes bitsandbytes' packed 4-bit bytes
and a :class:`~gputrain.quant.QuantState` (double-quantized absmax is expanded to float32 on
loading), and :meth:`QLinear.dequantize` gives the weight back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from gputrain._cast import widen
from gputrain.nn.layers import Linear, _positive_int
from gputrain.nn.module import Module, planning_active
from gputrain.quant import BLOCKSIZES_4BIT, QuantState, dequantize_4bit, quantize_4bit
from gputrain.quant.codes import DYNAMIC_SIGNED, code_table
from gputrain.quant.state import NESTED_BLOCKSIZE
from gputrain.quant.int8 import int8_vectorwise_quant

QUANT_TYPES_4BIT = ("nf4", "fp4")
HALF_TYPES = ("bf16", "f16")  # a weight in half precision alone: 2 bytes a weight, no scales
QUANT_TYPES = (*QUANT_TYPES_4BIT, "int8", *HALF_TYPES)
INT8_SCALE = np.float32(1 / 127)  # bitsandbytes' MatMul8bitFp: codes * (SCB * f32(1 / 127))

# Builds a model's Linear layers: (in_features, out_features, bias) -> module (a Linear, or a
# QLinear: the decoder blocks of from_pretrained(..., quantization=...)).
LinearFactory = Callable[[int, int, bool], Module]


def quantized_linears(quant_type: str, blocksize: int = 64, double_quant: bool = False) -> LinearFactory:
    """A LinearFactory of QLinear layers in quant_type ('nf4' | 'fp4' with `blocksize` and
    `double_quant`, 'int8', or 'bf16' | 'f16')."""
    check_quantization(quant_type, blocksize)
    return lambda i, o, bias: QLinear(i, o, bias, quant_type, blocksize, double_quant=double_quant)


def check_quantization(quant_type: Any, blocksize: Any, where: str = "") -> None:
    """Refuses an unknown quantization name or a 4-bit block size bitsandbytes does not have (int8
    has one absmax per row and a half weight none: `blocksize` is not used); `where` names the
    layer in messages. (4-bit
    blocks run over the flattened weight, as bitsandbytes' do, so any width quantizes: a block may
    span two rows.)"""
    at = f"{where}: " if where else ""
    if not isinstance(quant_type, str) or quant_type not in QUANT_TYPES:
        raise ValueError(f"{at}quantization must be one of {QUANT_TYPES}, got {quant_type!r}")
    if quant_type not in QUANT_TYPES_4BIT:
        return
    if isinstance(blocksize, bool) or not isinstance(blocksize, int) or blocksize not in BLOCKSIZES_4BIT:
        raise ValueError(f"{at}blocksize must be one of {BLOCKSIZES_4BIT} (bitsandbytes' 4-bit block sizes), "
                         f"got {blocksize!r}")


def _as_float16(weight: np.ndarray) -> np.ndarray:
    """The weight in float16, as bitsandbytes' Int8Params quantizes it (ValueError beyond float16's range)."""
    if weight.dtype == np.float16:
        return weight
    values = np.asarray(weight, np.float32)
    if np.isfinite(values).all() and np.abs(values).max(initial=0) > np.finfo(np.float16).max:
        raise ValueError(f"weight: int8 quantizes from float16, as bitsandbytes does; a value of "
                         f"{np.abs(values).max():g} is beyond float16's range")
    return values.astype(np.float16)


class QLinear(Module):
    """y = x dequant(W)^T + b with a frozen NF4/FP4/int8/bf16/f16 weight W of shape (out_features,
    in_features).

    A new QLinear's codes and absmax are zeros (W = 0) until quantize_() or load_quantized()
    writes them (a half weight: quantize_() rounds a float weight to it). blocksize: the 4-bit
    absmax block (int8: one per row; half: none; the argument is not used).
    tile_rows: rows of W dequantized per GEMM (0: about 2**23 elements a tile).
    double_quant (4-bit only): the absmax is held double-quantized, as bitsandbytes'
    compress_statistics (QLoRA's double quantization) keeps it: uint8 codes of absmax - offset in
    blocks of 256 (``weight.absmax``), their float32 absmax (``weight.nested_absmax``) and the
    float32 offset (``weight.offset``) -- about 1/8 of the float32 absmax's bytes. Each tile's absmax
    is dequantized as bitsandbytes computes it, so the layer computes what a QLinear holding that
    float32 absmax computes with the same tiles (a tile starts on a block of the absmax, 256
    blocks: with several tiles, the input gradient sums them in order)."""

    _param_names = ("bias",)
    _buffer_names = ("weight", "weight.absmax", "weight.nested_absmax", "weight.offset")

    def __init__(self, in_features: int, out_features: int, bias: bool = True, quant_type: str = "nf4",
                 blocksize: int = 64, tile_rows: int = 0, *, double_quant: bool = False) -> None:
        super().__init__()
        self.in_features = _positive_int(in_features, "in_features")
        self.out_features = _positive_int(out_features, "out_features")
        check_quantization(quant_type, blocksize, where="QLinear")
        if isinstance(tile_rows, bool) or not isinstance(tile_rows, int) or tile_rows < 0:
            raise ValueError(f"tile_rows must be an int >= 0, got {tile_rows!r}")
        if not isinstance(double_quant, bool):
            raise TypeError(f"double_quant must be a bool, not {type(double_quant).__name__}")
        if double_quant and quant_type not in QUANT_TYPES_4BIT:
            raise ValueError(f"double_quant=True compresses a 4-bit weight's absmax; {quant_type!r} has none to compress")
        self.has_bias = bool(bias)
        self.quant_type = quant_type
        self.blocksize = blocksize if quant_type in QUANT_TYPES_4BIT else 0
        self.tile_rows = tile_rows
        self.double_quant = double_quant
        self._compile()

    def _has_param(self, name: str) -> bool:
        return self.has_bias

    def _has_buffer(self, name: str) -> bool:
        if name in ("weight.nested_absmax", "weight.offset"):
            return self.double_quant
        return name == "weight" or not self.is_half

    @property
    def is_half(self) -> bool:
        """True for a weight held in half precision alone (quant_type 'bf16' or 'f16')."""
        return self.quant_type in HALF_TYPES

    def _spec(self) -> tuple:
        return ("qlinear", self.in_features, self.out_features, self.has_bias, self.quant_type, self.blocksize,
                self.tile_rows, self.double_quant)

    @property
    def packed_shape(self) -> tuple[int, int]:
        """The shape of the codes: (ceil(out * in / 2), 1), bitsandbytes' Params4bit; int8 and half:
        (out, in)."""
        if self.quant_type not in QUANT_TYPES_4BIT:
            return (self.out_features, self.in_features)
        return (-(-self.in_features * self.out_features // 2), 1)

    @property
    def num_blocks(self) -> int:
        """Absmax blocks of the weight (int8: its rows; half: none)."""
        if self.is_half:
            return 0
        if self.quant_type == "int8":
            return self.out_features
        return -(-self.in_features * self.out_features // self.blocksize)

    def quant_state(self) -> QuantState:
        """The 4-bit weight's QuantState (float32 absmax; double_quant: the nested state as held)."""
        if self.quant_type == "int8":
            raise ValueError(f"{self!r}: an int8 weight has no 4-bit QuantState; its row absmax is "
                             "getattr(layer, 'weight.absmax') (bitsandbytes' SCB)")
        if self.is_half:
            raise ValueError(f"{self!r}: a {self.quant_type} weight is not quantized (it has no QuantState)")
        code = code_table(self.quant_type).copy()
        code[code == 0] = 0.0
        shape = (self.out_features, self.in_features)
        if not self.double_quant:
            absmax = np.asarray(getattr(self, "weight.absmax"), np.float32).copy()
            return QuantState(self.quant_type, self.blocksize, shape, "f32", absmax, code)
        return QuantState(self.quant_type, self.blocksize, shape, "f32", np.asarray(getattr(self, "weight.absmax")).copy(),
                          code, offset=float(np.asarray(getattr(self, "weight.offset"))[0]),
                          nested_absmax=np.asarray(getattr(self, "weight.nested_absmax")).copy(),
                          nested_code=DYNAMIC_SIGNED.copy(), nested_blocksize=NESTED_BLOCKSIZE)

    def dequantize(self) -> np.ndarray:
        """The weight as float32 (out_features, in_features): code * absmax per element (int8:
        code * float32(absmax * float32(1 / 127)) per row, as the layer computes it; half: the
        stored values, exactly)."""
        if self.is_half:
            return widen(np.asarray(self.weight))
        if self.quant_type == "int8":
            absmax = np.asarray(getattr(self, "weight.absmax"), np.float32)
            return np.asarray(self.weight).astype(np.float32) * (absmax * INT8_SCALE)[:, None]
        return dequantize_4bit(np.asarray(self.weight), self.quant_state())

    def quantize_(self, weight: Any) -> QLinear:
        """Quantizes a float32/float16/bfloat16 weight of shape (out_features, in_features) into this
        layer (gputrain.quant.quantize_4bit, or int8_vectorwise_quant of the weight rounded to float16
        as bitsandbytes' Int8Params does: bitsandbytes' codes, bit for bit; half: the weight rounded
        to nearest even, as torch's .to(dtype))."""
        shape = (self.out_features, self.in_features)
        if np.shape(weight) != shape:
            raise ValueError(f"weight: expected shape {shape}, got {np.shape(weight)}")
        weight = weight if isinstance(weight, np.ndarray) else np.asarray(weight, np.float32)
        if self.is_half:
            self.load_state_dict({"weight": weight}, strict=False)
            return self
        if self.quant_type == "int8":
            self._write_codes(*int8_vectorwise_quant(_as_float16(weight)))
            return self
        packed, state = quantize_4bit(weight, self.blocksize, self.quant_type, compress_statistics=self.double_quant)
        self._write_codes(packed, state.absmax, state if self.double_quant else None)
        return self

    def load_quantized(self, packed: Any, state: QuantState | np.ndarray) -> QLinear:
        """Takes a weight as bitsandbytes stores it: 4-bit, packed uint8 bytes and its QuantState (a
        double-quantized absmax is held as it is by a double_quant layer, expanded to float32 by
        another, bit-exact with bitsandbytes' dequantization; a double_quant layer refuses a float32
        one); int8, the (out, in) int8 codes and their float32 row absmax (Int8Params' CB and SCB). A
        half weight has no codes: quantize_() writes it."""
        if self.is_half:
            raise ValueError(f"{self!r}: a {self.quant_type} weight has no quantized codes; write it with quantize_()")
        if self.quant_type == "int8":
            scb = np.asarray(state)
            if scb.dtype != np.float32 or scb.shape != (self.out_features,):
                raise ValueError(f"state: an int8 layer takes the float32 row absmax (SCB) of shape "
                                 f"({self.out_features},), got {scb.dtype} {scb.shape}")
            self._write_codes(np.asarray(packed), scb)
            return self
        if not isinstance(state, QuantState):
            raise TypeError(f"state must be a gputrain.quant.QuantState, not {type(state).__name__}")
        if state.quant_type != self.quant_type or state.blocksize != self.blocksize:
            raise ValueError(f"state: {state.quant_type} with blocksize {state.blocksize} does not fit this layer's "
                             f"{self.quant_type} with blocksize {self.blocksize}")
        if tuple(state.shape) != (self.out_features, self.in_features):
            raise ValueError(f"state: shape {tuple(state.shape)} is not this layer's "
                             f"{(self.out_features, self.in_features)}")
        if self.double_quant and not (state.nested and state.nested_blocksize == NESTED_BLOCKSIZE):
            raise ValueError(f"state: this layer holds a double-quantized absmax (blocks of {NESTED_BLOCKSIZE}); "
                             "the state's is not (build the QLinear with double_quant=False to take it)")
        if self.double_quant:
            self._write_codes(np.asarray(packed), state.absmax, state)
        else:
            self._write_codes(np.asarray(packed), state.block_absmax())
        return self

    def _write_codes(self, packed: np.ndarray, absmax: np.ndarray, nested_state: QuantState | None = None) -> None:
        """Writes the codes and their absmax (double_quant: the uint8 codes of nested_state's
        absmax, its nested absmax and offset), after checking every size."""
        dtype = np.int8 if self.quant_type == "int8" else np.uint8
        count = self.packed_shape[0] * self.packed_shape[1]
        if packed.dtype != dtype or packed.size != count:
            raise ValueError(f"packed: expected {count} {np.dtype(dtype)} codes, got {packed.size} {packed.dtype}")
        absmax = np.asarray(absmax).reshape(-1)
        if absmax.size != self.num_blocks:
            raise ValueError(f"absmax: expected {self.num_blocks} blocks, got {absmax.size}")
        values = {"weight": packed.reshape(self.packed_shape)}
        if nested_state is None:
            values["weight.absmax"] = absmax.astype(np.float32)
        else:
            nested = np.asarray(nested_state.nested_absmax, np.float32).reshape(-1)
            want = -(-absmax.size // NESTED_BLOCKSIZE)
            if absmax.dtype != np.uint8 or nested.size != want:
                raise ValueError(f"absmax: a double-quantized absmax is {absmax.size} uint8 codes and {want} float32 "
                                 f"nested absmax, got {absmax.dtype} codes and {nested.size} nested absmax")
            values.update({"weight.absmax": absmax, "weight.nested_absmax": nested,
                           "weight.offset": np.array([nested_state.offset], np.float32)})
        self.load_state_dict(values, strict=False)

    @classmethod
    def from_linear(cls, linear: Linear, quant_type: str = "nf4", blocksize: int = 64, tile_rows: int = 0, *,
                    double_quant: bool = False) -> QLinear:
        """A QLinear holding `linear`'s weight quantized and a copy of its bias (under
        gputrain.memory_plan.planning(): the configuration only)."""
        q = cls(linear.in_features, linear.out_features, linear.has_bias, quant_type, blocksize, tile_rows,
                double_quant=double_quant)
        if planning_active():  # a model built for planning holds no values
            return q
        q.quantize_(linear.weight.data)
        if linear.has_bias:
            q.load_state_dict({"bias": linear.bias.data}, strict=False)
        return q

    def requires_grad_(self, requires_grad: bool = True) -> QLinear:
        """Sets the bias's requires_grad; the stored weight is frozen and refuses True."""
        if requires_grad:
            raise ValueError(f"{self!r}: the stored {self.quant_type} weight is frozen (it has no gradient); train "
                             "an adapter on it, or use a Linear with the dequantized weight (QLinear.dequantize())")
        if self.has_bias:
            self.bias.requires_grad = False
        return self

    def merge_(self, delta: Any) -> None:
        """Merging a delta (an adapter) into the quantized weight is refused: re-quantizing would
        change the base's other bits; dequantize() into a Linear and merge there."""
        raise ValueError(f"{self!r}: cannot merge into a quantized (frozen) weight; dequantize it into a Linear "
                         "first (QLinear.dequantize()) and merge into that")

    def extra_repr(self) -> str:
        block = f", blocksize={self.blocksize}" if self.quant_type in QUANT_TYPES_4BIT else ""
        block += ", double_quant=True" if self.double_quant else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.has_bias}, "
                f"quant_type={self.quant_type!r}{block}")

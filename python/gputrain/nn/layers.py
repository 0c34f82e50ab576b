"""The built-in layers, with PyTorch's constructor arguments and parameter names."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator

from gputrain.nn.module import Module


def _positive_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    if value > sys.maxsize:  # no tensor of this machine can have that many elements in a row
        raise ValueError(f"{name} is too large: {value} (at most {sys.maxsize})")
    return value


# The layer classes gputrain.nn exports: a new layer kind adds its class here and to this list.
__all__ = [
    "AdaptiveAvgPool2d",
    "AvgPool2d",
    "BatchNorm2d",
    "Conv2d",
    "Dropout",
    "Embedding",
    "Flatten",
    "GELU",
    "GatedActivation",
    "LayerNorm",
    "Linear",
    "MaxPool2d",
    "MultiheadAttention",
    "Parallel",
    "RMSNorm",
    "ReLU",
    "Residual",
    "RotaryEmbedding",
    "Scale",
    "Sequential",
    "SiLU",
    "Tanh",
]


class Linear(Module):
    """y = x W^T + b with W of shape (out_features, in_features)."""

    _param_names = ("weight", "bias")

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        self.in_features = _positive_int(in_features, "in_features")
        self.out_features = _positive_int(out_features, "out_features")
        self.has_bias = bool(bias)
        self._compile()

    def _has_param(self, name: str) -> bool:
        return name == "weight" or self.has_bias

    def _spec(self) -> tuple:
        return ("linear", self.in_features, self.out_features, self.has_bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.has_bias}"


class _Activation(Module):
    _c_name = ""

    def _spec(self) -> tuple:
        return ("activation", self._c_name)


class ReLU(_Activation):
    """max(x, 0), element-wise."""
    _c_name = "relu"


class Tanh(_Activation):
    """tanh(x), element-wise."""
    _c_name = "tanh"


class SiLU(_Activation):
    """x * sigmoid(x) (swish), element-wise."""
    _c_name = "silu"


class GELU(_Activation):
    """GELU with approximate='none' (erf, exact) or 'tanh'."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate
        self._c_name = "gelu" if approximate == "none" else "gelu_tanh"

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class Dropout(Module):
    """Zeroes elements with probability p in [0, 1] in training, scaling the rest by 1/(1-p)
    (float32, rounded as PyTorch's CPU dropout; p = 1 zeroes everything); the mask comes from
    Philox(seed, layer, step, index), so it is reproducible and never stored."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if isinstance(p, bool) or not isinstance(p, (int, float)):
            raise TypeError(f"p must be a float, not {type(p).__name__}")
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = float(p)

    def _spec(self) -> tuple:
        return ("dropout", self.p)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class LayerNorm(Module):
    """Normalises the last dimension: (x - mean) / sqrt(var + eps) * weight + bias."""

    _param_names = ("weight", "bias")

    def __init__(self, normalized_shape: int | tuple[int], eps: float = 1e-5, bias: bool = True) -> None:
        super().__init__()
        if isinstance(normalized_shape, tuple):
            if len(normalized_shape) != 1:
                raise ValueError("normalized_shape: only the last dimension can be normalised")
            normalized_shape = normalized_shape[0]
        self.normalized_shape = _positive_int(normalized_shape, "normalized_shape")
        if not eps > 0:
            raise ValueError(f"eps must be positive, got {eps}")
        self.eps = float(eps)
        self.has_bias = bool(bias)
        self._compile()

    def _has_param(self, name: str) -> bool:
        return name == "weight" or self.has_bias

    def _spec(self) -> tuple:
        return ("layernorm", self.normalized_shape, self.eps, self.has_bias)

    def extra_repr(self) -> str:
        return f"({self.normalized_shape},), eps={self.eps}"


class RMSNorm(Module):
    """Root-mean-square normalisation of the last dimension, PyTorch's ``nn.RMSNorm``:
    ``x / sqrt(mean(x^2) + eps) * weight``, the statistics in float32 or wider whatever the
    precision; ``weight`` (normalized_shape,) starts at 1 and exists with ``elementwise_affine``."""

    _param_names = ("weight",)

    def __init__(self, normalized_shape: int | tuple[int], eps: float = 1e-6, elementwise_affine: bool = True,
                 *, plus_one: bool = False, groups: int = 1) -> None:
        super().__init__()
        if isinstance(normalized_shape, tuple):
            if len(normalized_shape) != 1:
                raise ValueError("normalized_shape: only the last dimension can be normalised")
            normalized_shape = normalized_shape[0]
        self.normalized_shape = _positive_int(normalized_shape, "normalized_shape")
        if eps is None:
            raise ValueError("eps: None (PyTorch's machine epsilon of the input's dtype) is not supported; "
                             "pass a number, e.g. 1e-6")
        if isinstance(eps, bool) or not isinstance(eps, (int, float)):
            raise TypeError(f"eps must be a float, not {type(eps).__name__}")
        if not 0 < eps < float("inf"):
            raise ValueError(f"eps must be positive and finite, got {eps}")
        self.eps = float(eps)
        self.elementwise_affine = bool(elementwise_affine)
        self.plus_one = bool(plus_one)
        self.groups = _positive_int(groups, "groups")
        self._compile()

    def _has_param(self, name: str) -> bool:
        return self.elementwise_affine

    def _spec(self) -> tuple:
        return ("rmsnorm", self.normalized_shape, self.eps, self.elementwise_affine, self.plus_one, self.groups)

    def extra_repr(self) -> str:
        extra = (", plus_one=True" if self.plus_one else "") + (f", groups={self.groups}" if self.groups > 1 else "")
        return f"({self.normalized_shape},), eps={self.eps}, elementwise_affine={self.elementwise_affine}{extra}"


class GatedActivation(Module):
    """act(gate) * up of an input (..., 2 * I) laid out [gate | up] -> (..., I): the gated MLP of
    Llama (SwiGLU, activation="silu") and Gemma (GeGLU, "gelu_tanh"), rounded as PyTorch's eager
    ``act_fn(gate) * up``. Not named GLU: torch.nn.GLU is a * sigmoid(b) of the halves [a | b]."""

    _activations = ("silu", "gelu_tanh", "gelu", "relu", "tanh")

    def __init__(self, activation: str = "silu") -> None:
        super().__init__()
        if not isinstance(activation, str):
            raise TypeError(f"activation must be a str, not {type(activation).__name__}")
        if activation not in self._activations:
            raise ValueError(f"activation must be one of {', '.join(map(repr, self._activations))}, got {activation!r}")
        self.activation = activation
        self._compile()

    def _spec(self) -> tuple:
        return ("glu", self.activation)

    def extra_repr(self) -> str:
        return repr(self.activation)


class Scale(Module):
    """y = x * factor, the factor rounded to the activation dtype first (as Hugging Face's Gemma
    multiplies its embeddings by torch.tensor(sqrt(hidden_size), dtype=x.dtype)); factor is a
    finite nonzero real."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        if isinstance(factor, bool) or not isinstance(factor, (int, float)):
            raise TypeError(f"factor must be a real number, not {type(factor).__name__}")
        factor = float(factor)
        if not math.isfinite(factor) or factor == 0.0:
            raise ValueError(f"factor must be finite and nonzero, got {factor}")
        self.factor = factor
        self._compile()

    def _spec(self) -> tuple:
        return ("scale", self.factor)

    def extra_repr(self) -> str:
        return repr(self.factor)


_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def _rope_real(value: object, name: str, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, not {type(value).__name__}")
    value = float(value)
    if not (value > 0 if positive else value >= 0) or value == float("inf"):
        raise ValueError(f"{name} must be finite and {'> 0' if positive else '>= 0'}, got {value}")
    return value


class RotaryEmbedding(Module):
    """Hugging Face's rotary position embedding (``apply_rotary_pos_emb``, ``rotate_half`` layout)
    of a decoder's fused projection ``(batch, seq, (num_heads + 2 num_kv_heads) head_dim)`` laid
    out ``[q heads | k heads | v heads]``: q and k rotate at the model's position ids (the last
    channel of a ``TokenEmbedding(..., position_ids=True)``'s input; 0..seq-1 without one), v
    passes through. ``rope_type`` and the scaling fields are those of transformers'
    ``rope_parameters`` ("default", "linear", "llama3", "yarn"); cos and sin are multiplied by
    ``attention_factor`` (yarn's attention scaling; 1 otherwise). No parameters: the inverse
    frequencies are computed in C (float32, transformers' roundings) and kept with the model's
    activations, never in ``state_dict``."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, rope_type: str = "default",
                 theta: float = 10000.0, factor: float = 1.0, low_freq_factor: float = 1.0,
                 high_freq_factor: float = 4.0, original_max_position_embeddings: float = 0.0,
                 attention_factor: float = 1.0, beta_fast: float = 32.0, beta_slow: float = 1.0,
                 truncate: bool = True) -> None:
        super().__init__()
        self.num_heads = _positive_int(num_heads, "num_heads")
        self.num_kv_heads = _positive_int(num_kv_heads, "num_kv_heads")
        self.head_dim = _positive_int(head_dim, "head_dim")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even, got {head_dim}")
        if rope_type not in _ROPE_TYPES:
            raise ValueError(f"rope_type must be one of {', '.join(_ROPE_TYPES)}, got {rope_type!r}")
        self.rope_type = rope_type
        self.theta = _rope_real(theta, "theta", True)
        self.factor = _rope_real(factor, "factor", False)
        self.low_freq_factor = _rope_real(low_freq_factor, "low_freq_factor", False)
        self.high_freq_factor = _rope_real(high_freq_factor, "high_freq_factor", False)
        self.original_max_position_embeddings = _rope_real(
            original_max_position_embeddings, "original_max_position_embeddings", False)
        self.attention_factor = _rope_real(attention_factor, "attention_factor", True)
        self.beta_fast = _rope_real(beta_fast, "beta_fast", False)
        self.beta_slow = _rope_real(beta_slow, "beta_slow", False)
        self.truncate = bool(truncate)
        self._compile()

    def _spec(self) -> tuple:
        return ("rope", self.num_heads, self.num_kv_heads, self.head_dim, self.rope_type, self.theta, self.factor,
                self.low_freq_factor, self.high_freq_factor, self.original_max_position_embeddings,
                self.attention_factor, self.beta_fast, self.beta_slow, self.truncate)

    def extra_repr(self) -> str:
        return (f"{self.num_heads}, {self.num_kv_heads}, {self.head_dim}, rope_type={self.rope_type!r}, "
                f"theta={self.theta}")


class Embedding(Module):
    """Rows of a (num_embeddings, embedding_dim) table looked up by int64 ids."""

    _param_names = ("weight",)

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.num_embeddings = _positive_int(num_embeddings, "num_embeddings")
        self.embedding_dim = _positive_int(embedding_dim, "embedding_dim")
        self._compile()

    def _spec(self) -> tuple:
        return ("embedding", self.num_embeddings, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"


class Flatten(Module):
    """(N, d1, d2, ...) -> (N, d1 * d2 * ...), a view."""

    def _spec(self) -> tuple:
        return ("flatten",)


class MultiheadAttention(Module):
    """Multi-head scaled dot-product attention over (batch, seq, embed_dim) inputs (self-attention:
    query, key and value are all the input), as one C layer tree: a fused QKV projection
    ``in_proj = Linear(embed_dim, 3 * embed_dim, bias)``, the fused attention op (blocked online
    softmax, ``causal`` masking, ``dropout`` on the probabilities in training) and
    ``out_proj = Linear(embed_dim, embed_dim, bias)``.

    state_dict names and shapes (E = embed_dim): ``in_proj.weight`` (3E, E) and ``in_proj.bias``
    (3E,), rows [0, E) projecting the queries, [E, 2E) the keys, [2E, 3E) the values, head h
    using columns [h D, (h + 1) D) of each (D = E / num_heads): PyTorch's
    ``nn.MultiheadAttention`` ``in_proj_weight``/``in_proj_bias`` have this layout;
    ``out_proj.weight`` (E, E) and ``out_proj.bias`` (E,). Both projections start with
    Linear's default initialisation. Key padding: in a model whose first layer is a
    ``TokenEmbedding(..., attention_mask=True)`` every MultiheadAttention masks the keys after each
    sequence's length (gputrain.nn.sequence); :func:`gputrain.functional.scaled_dot_product_attention`
    takes key lengths directly."""

    def __init__(self, embed_dim: int, num_heads: int, bias: bool = True, dropout: float = 0.0,
                 causal: bool = False) -> None:
        super().__init__()
        self.embed_dim = _positive_int(embed_dim, "embed_dim")
        self.num_heads = _positive_int(num_heads, "num_heads")
        if self.embed_dim % self.num_heads:
            raise ValueError(f"embed_dim must be divisible by num_heads, got {embed_dim} and {num_heads}")
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)):
            raise TypeError(f"dropout must be a float, not {type(dropout).__name__}")
        if not 0.0 <= dropout <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {dropout}")
        self.dropout = float(dropout)
        self.causal = bool(causal)
        self.head_dim = self.embed_dim // self.num_heads
        self.in_proj = Linear(self.embed_dim, 3 * self.embed_dim, bias)
        self.out_proj = Linear(self.embed_dim, self.embed_dim, bias)
        self._compile()

    def named_children(self) -> Iterator[tuple[str, Module]]:
        return iter((("in_proj", self.in_proj), ("out_proj", self.out_proj)))

    def _spec_in(self, tied: dict[int, int]) -> tuple:
        core = ("attention", self.embed_dim, self.num_heads, self.dropout, self.causal, 0, 0, 0, 0.0)
        return ("sequential", [self.in_proj._spec_in(tied), core, self.out_proj._spec_in(tied)])

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, dropout={self.dropout}, "
                f"causal={self.causal}")


_INT32_MAX = 2**31 - 1


def _int32(value: object, name: str) -> int:
    """A positive int of at most 2**31 - 1 (the sizes the convolution's GEMMs take)."""
    value = _positive_int(value, name)
    if value > _INT32_MAX:
        raise ValueError(f"{name} must be at most {_INT32_MAX}, got {value}")
    return value


def _pair(value: object, name: str, minimum: int = 1) -> tuple[int, int]:
    """An int or a pair of ints, each in [minimum, 2**31 - 1], as a pair."""
    items = tuple(value) if isinstance(value, (tuple, list)) else (value, value)
    if len(items) != 2:
        raise ValueError(f"{name} must be an int or a pair of ints, got {value!r}")
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int):
            raise TypeError(f"{name} must be an int or a pair of ints, not {type(item).__name__}")
        if not minimum <= item <= _INT32_MAX:
            raise ValueError(f"{name} must be in [{minimum}, {_INT32_MAX}], got {value!r}")
    return items[0], items[1]


class Conv2d(Module):
    """2-D convolution over (N, C, H, W) inputs with PyTorch's ``nn.Conv2d`` arguments (zero
    padding): ``kernel_size``, ``stride``, ``padding`` and ``dilation`` are ints or (height, width)
    pairs; ``padding`` may also be ``'valid'`` (0) or ``'same'`` (stride 1 and an even total
    padding ``dilation * (kernel_size - 1)`` per dimension). Parameters as PyTorch's: ``weight``
    (out_channels, in_channels / groups, kh, kw) and ``bias`` (out_channels,), both
    ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with fan_in = in_channels / groups * kh * kw. The output
    is (N, out_channels, OH, OW), OH = (H + 2 padding - dilation (kh - 1) - 1) // stride + 1."""

    _param_names = ("weight", "bias")

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | tuple[int, int],
                 stride: int | tuple[int, int] = 1, padding: int | tuple[int, int] | str = 0,
                 dilation: int | tuple[int, int] = 1, groups: int = 1, bias: bool = True) -> None:
        super().__init__()
        self.in_channels = _int32(in_channels, "in_channels")
        self.out_channels = _int32(out_channels, "out_channels")
        self.kernel_size = _pair(kernel_size, "kernel_size", 1)
        self.stride = _pair(stride, "stride", 1)
        self.dilation = _pair(dilation, "dilation", 1)
        self.padding = self._padding(padding)
        self.groups = _int32(groups, "groups")
        if self.in_channels % self.groups or self.out_channels % self.groups:
            raise ValueError(f"in_channels ({self.in_channels}) and out_channels ({self.out_channels}) "
                             f"must be divisible by groups ({self.groups})")
        self.has_bias = bool(bias)
        self._compile()

    def _padding(self, padding: int | tuple[int, int] | str) -> tuple[int, int]:
        if not isinstance(padding, str):
            return _pair(padding, "padding", 0)
        if padding == "valid":
            return 0, 0
        if padding != "same":
            raise ValueError(f"padding must be an int, a pair of ints, 'valid' or 'same', got {padding!r}")
        if self.stride != (1, 1):
            raise ValueError("padding='same' needs stride 1 (as in PyTorch)")
        totals = [d * (k - 1) for d, k in zip(self.dilation, self.kernel_size)]
        if any(total % 2 for total in totals):
            raise ValueError(f"padding='same' with kernel_size {self.kernel_size} and dilation {self.dilation} "
                             "needs uneven padding, which gputrain does not support: pass an odd kernel_size")
        return totals[0] // 2, totals[1] // 2

    def _has_param(self, name: str) -> bool:
        return name == "weight" or self.has_bias

    def _spec(self) -> tuple:
        return ("conv2d", self.in_channels, self.out_channels, self.kernel_size, self.stride,
                self.padding, self.dilation, self.groups, self.has_bias)

    def extra_repr(self) -> str:
        text = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0, 0):
            text += f", padding={self.padding}"
        if self.dilation != (1, 1):
            text += f", dilation={self.dilation}"
        if self.groups != 1:
            text += f", groups={self.groups}"
        return text + ("" if self.has_bias else ", bias=False")


class BatchNorm2d(Module):
    """Batch normalisation of (N, C, H, W) activations over N, H and W per channel, PyTorch's
    semantics: in training, the batch's mean and biased variance normalise, and (with
    ``track_running_stats``) the running statistics move by ``momentum`` towards the batch's mean
    and unbiased variance (``momentum=None``: a cumulative average over num_batches_tracked);
    in eval, the running statistics normalise. ``affine`` adds weight (1) and bias (0) of shape
    (C,). The running statistics are buffers: named_buffers() and state_dict() list
    ``running_mean``, ``running_var`` and ``num_batches_tracked``. A checkpointed block's
    recompute does not update them twice."""

    _param_names = ("weight", "bias")
    _buffer_names = ("running_mean", "running_var", "num_batches_tracked")

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True) -> None:
        super().__init__()
        self.num_features = _positive_int(num_features, "num_features")
        if self.num_features >= 2**31:
            raise ValueError(f"num_features must be below 2**31, got {num_features}")
        if isinstance(eps, bool) or not isinstance(eps, (int, float)):
            raise TypeError(f"eps must be a float, not {type(eps).__name__}")
        if not 0 < eps < float("inf"):
            raise ValueError(f"eps must be positive and finite, got {eps}")
        if momentum is not None:
            if isinstance(momentum, bool) or not isinstance(momentum, (int, float)):
                raise TypeError(f"momentum must be a float or None, not {type(momentum).__name__}")
            if not 0.0 <= momentum <= 1.0:
                raise ValueError(f"momentum must be in [0, 1] or None, got {momentum}")
        self.eps = float(eps)
        self.momentum = None if momentum is None else float(momentum)
        self.affine = bool(affine)
        self.track_running_stats = bool(track_running_stats)
        self._compile()

    def _has_param(self, name: str) -> bool:
        return self.affine

    def _has_buffer(self, name: str) -> bool:
        return self.track_running_stats

    def _spec(self) -> tuple:
        momentum = -1.0 if self.momentum is None else self.momentum
        return ("batchnorm2d", self.num_features, self.eps, momentum, self.affine, self.track_running_stats)

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"track_running_stats={self.track_running_stats}")


class _Pool2d(Module):
    """Shared spec of the pooling layers: ("pool2d", kind, kernel, stride, padding, dilation,
    ceil_mode, count_include_pad)."""

    _kind = ""

    def _spec(self) -> tuple:
        return ("pool2d", self._kind, self._kernel, self._stride, self._padding, self._dilation,
                self.ceil_mode, self.count_include_pad)


class MaxPool2d(_Pool2d):
    """Maximum over kernel_size windows of (N, C, H, W) activations (stride defaults to
    kernel_size; padding never wins; dilation spaces the window; ceil_mode rounds the output size
    up). Backward sends each gradient to the window's first maximum, as PyTorch's CPU kernel."""

    _kind = "max"

    def __init__(self, kernel_size: int | tuple[int, int], stride: int | tuple[int, int] | None = None,
                 padding: int | tuple[int, int] = 0, dilation: int | tuple[int, int] = 1,
                 return_indices: bool = False, ceil_mode: bool = False) -> None:
        super().__init__()
        if return_indices:
            raise ValueError("return_indices: MaxPool2d returns the pooled values only (the backward "
                             "recomputes the argmax); leave it False")
        self.kernel_size = self._kernel = _pair(kernel_size, "kernel_size")
        self.stride = self._stride = self._kernel if stride is None else _pair(stride, "stride")
        self.padding = self._padding = _pair(padding, "padding", 0)
        self.dilation = self._dilation = _pair(dilation, "dilation")
        for k, p, d in zip(self._kernel, self._padding, self._dilation):
            if p > ((k - 1) * d + 1) // 2:
                raise ValueError(f"padding should be at most half of effective kernel size, but got "
                                 f"padding={padding}, kernel_size={kernel_size} and dilation={dilation}")
        self.ceil_mode = bool(ceil_mode)
        self.count_include_pad = False

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, ceil_mode={self.ceil_mode}")


class AvgPool2d(_Pool2d):
    """Mean over kernel_size windows of (N, C, H, W) activations (stride defaults to
    kernel_size), dividing by the window clipped to the padded input (count_include_pad) or to the
    input; ceil_mode rounds the output size up."""

    _kind = "avg"

    def __init__(self, kernel_size: int | tuple[int, int], stride: int | tuple[int, int] | None = None,
                 padding: int | tuple[int, int] = 0, ceil_mode: bool = False, count_include_pad: bool = True,
                 divisor_override: int | None = None) -> None:
        super().__init__()
        if divisor_override is not None:
            raise ValueError("divisor_override: not supported; leave it None (the divisor follows "
                             "count_include_pad)")
        self.kernel_size = self._kernel = _pair(kernel_size, "kernel_size")
        self.stride = self._stride = self._kernel if stride is None else _pair(stride, "stride")
        self.padding = self._padding = _pair(padding, "padding", 0)
        self._dilation = (1, 1)
        for k, p in zip(self._kernel, self._padding):
            if p > k // 2:
                raise ValueError(f"pad should be smaller than or equal to half of kernel size, but got "
                                 f"padding={padding}, kernel_size={kernel_size}")
        self.ceil_mode = bool(ceil_mode)
        self.count_include_pad = bool(count_include_pad)

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"ceil_mode={self.ceil_mode}, count_include_pad={self.count_include_pad}")


class AdaptiveAvgPool2d(_Pool2d):
    """Mean of (N, C, H, W) activations into an output_size (int or (OH, OW)) grid: output row i
    averages rows [floor(i H / OH), ceil((i + 1) H / OH)), likewise for columns (PyTorch's
    windows); output_size 1 is global average pooling."""

    _kind = "adaptive_avg"

    def __init__(self, output_size: int | tuple[int, int]) -> None:
        super().__init__()
        self.output_size = self._kernel = _pair(output_size, "output_size")
        self._stride, self._padding, self._dilation = (1, 1), (0, 0), (1, 1)
        self.ceil_mode = False
        self.count_include_pad = True

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class Sequential(Module):
    """Layers applied in order; children are named '0', '1', ... as in PyTorch."""

    def __init__(self, *layers: Module) -> None:
        super().__init__()
        for i, layer in enumerate(layers):
            if not isinstance(layer, Module):
                raise TypeError(f"layer {i} must be a gputrain.nn.Module, not {type(layer).__name__}")
        self.layers = list(layers)
        self._compile()

    def named_children(self) -> Iterator[tuple[str, Module]]:
        return ((str(i), layer) for i, layer in enumerate(self.layers))

    def __getitem__(self, index: int) -> Module:
        return self.layers[index]

    def __len__(self) -> int:
        return len(self.layers)

    def _spec_in(self, tied: dict[int, int]) -> tuple:
        return ("sequential", self._spec_list(tied))

    def _spec_list(self, tied: dict[int, int] | None = None) -> list[tuple]:
        tied = {} if tied is None else tied
        return [layer._spec_in(tied) for layer in self.layers]


class Parallel(Module):
    """Modules applied to the same input, their outputs concatenated along the last dimension
    in order (their other dimensions must agree); the input's gradient is the sum of theirs.
    Children are named '0', '1', ... as a Sequential's (e.g. Llama's q_proj | k_proj | v_proj)."""

    def __init__(self, *modules: Module) -> None:
        super().__init__()
        if not modules:
            raise ValueError("modules: Parallel needs at least one module")
        for i, module in enumerate(modules):
            if not isinstance(module, Module):
                raise TypeError(f"module {i} must be a gputrain.nn.Module, not {type(module).__name__}")
        self.branches = list(modules)
        self._compile()

    def named_children(self) -> Iterator[tuple[str, Module]]:
        return ((str(i), module) for i, module in enumerate(self.branches))

    def __getitem__(self, index: int) -> Module:
        return self.branches[index]

    def __len__(self) -> int:
        return len(self.branches)

    def _spec_in(self, tied: dict[int, int]) -> tuple:
        return ("parallel", [module._spec_in(tied) for module in self.branches])


class Residual(Module):
    """x + block(x); with gradient checkpointing only x is kept and block(x) is recomputed
    during backward. The block is a Sequential (layers given here are wrapped in one)."""

    def __init__(self, *block: Module) -> None:
        super().__init__()
        if len(block) == 1 and isinstance(block[0], Sequential):
            self.block = block[0]
        else:
            self.block = Sequential(*block)
        self._compile()

    def named_children(self) -> Iterator[tuple[str, Module]]:
        return iter((("block", self.block),))

    def _spec_in(self, tied: dict[int, int]) -> tuple:
        return ("residual", self.block._spec_list(tied))

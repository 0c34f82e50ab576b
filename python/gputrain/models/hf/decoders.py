"""config.json of the Llama-like decoder families (issue 21): ``llama``, ``qwen2``, ``qwen3``,
``mistral``, ``gemma`` and ``gemma3_text``, parsed into one typed :class:`DecoderConfig`.

The models are built from it by decoder_models.py, which registers the six families with
``from_pretrained``; this module is the part of each family that reads config.json:
:func:`parse_decoder_config` reads EVERY field
through config.py's :class:`HFConfig`, so a field is implemented (it ends up in the dataclass),
accepted only at transformers' default (another value is refused naming it), irrelevant to the
arithmetic, or unknown (refused naming it). Both spellings (transformers >= 5's
``rope_parameters``/``dtype``/``layer_types``, and the older ``rope_theta``/``rope_scaling``/
``torch_dtype``, Gemma3's ``rope_local_base_freq``/``sliding_window_pattern``, Qwen's
``use_sliding_window``/``max_window_layers`` without ``layer_types``) give the same dataclass.

Per family (transformers 5.25's configuration_<family>.py lists every field):

- all six, implemented: ``vocab_size``, ``hidden_size``, ``intermediate_size``,
  ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads`` (null: the heads; must
  divide them), ``rms_norm_eps``, ``tie_word_embeddings``, ``max_position_embeddings``,
  the rotary embedding (below), ``dtype``/``torch_dtype``; for ...ForSequenceClassification
  ``pad_token_id``, ``num_labels`` (``id2label``), ``problem_type``.
- accepted only at the default: ``attention_dropout`` (0: gputrain's attention has no dropout).
- irrelevant: ``initializer_range``, ``pretraining_tp`` (llama: transformers 5 ignores it),
  ``use_cache`` and PretrainedConfig's bookkeeping (config.GENERIC_IRRELEVANT).
- llama: ``head_dim`` (null: hidden/heads), ``hidden_act`` (silu), ``attention_bias`` (q, k, v
  and o projections), ``mlp_bias`` (gate, up, down).
- qwen2: no head_dim (hidden/heads); q, k, v biases always, o without; ``hidden_act`` (silu);
  sliding windows: ``use_sliding_window``, ``sliding_window``, ``max_window_layers``,
  ``layer_types`` (a sliding layer needs use_sliding_window).
- qwen3: as qwen2 plus ``head_dim`` (default 128), ``attention_bias`` (q, k, v, o), QK-norm
  (RMSNorm over head_dim on queries and keys, always on).
- mistral: ``head_dim``, ``hidden_act`` (silu), ``sliding_window`` (null: none) on every layer.
- gemma: ``head_dim`` (default 256), ``hidden_act`` (``gelu_pytorch_tanh``; ``gelu`` also means the
  tanh approximation, as transformers rewrites it), ``attention_bias``,
  ``use_bidirectional_attention`` (null or false only), (1 + w) RMSNorm and embeddings times
  sqrt(hidden_size) always; tied head by default; ``hidden_activation`` (older files) null only,
  since transformers 5 reads hidden_act alone.
- gemma3_text: as gemma with ``hidden_activation``, QK-norm with (1 + w), ``query_pre_attn_scalar``
  (attention scale query_pre_attn_scalar**-0.5), ``sliding_window``, ``layer_types`` (or the older
  ``sliding_window_pattern``, default 6; ``_sliding_window_pattern``, written by transformers 5 but
  unused when layer_types is there, is irrelevant), ``final_logit_softcapping``,
  ``attn_logit_softcapping`` (null only: transformers 5.25's Gemma3 never applies it),
  ``use_bidirectional_attention`` (false only), and two ropes
  (``rope_parameters`` {"full_attention": ..., "sliding_attention": ...}, or ``rope_theta`` +
  ``rope_scaling`` for full layers and ``rope_local_base_freq`` for sliding ones).

The rotary embedding: ``rope_type`` default, linear (``factor``), llama3 (``factor``,
``low_freq_factor``, ``high_freq_factor``, ``original_max_position_embeddings``) and yarn
(``factor``, ``original_max_position_embeddings``, optional ``attention_factor``, ``beta_fast``,
``beta_slow``, ``mscale`` + ``mscale_all_dim``, ``truncate``); refused: dynamic, longrope,
proportional and any other type, and ``partial_rotary_factor`` other than 1 (none of these six
families' modeling code rotates part of a head). Any other key in a rope dict is refused by name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from gputrain.models.hf.config import HFConfig

FAMILY_NAMES = ("llama", "qwen2", "qwen3", "mistral", "gemma", "gemma3_text")
LAYER_TYPES = ("full_attention", "sliding_attention")
PROBLEM_TYPES = (None, "regression", "single_label_classification", "multi_label_classification")
_ROPE_KEYS = {
    "default": {"rope_type", "rope_theta", "partial_rotary_factor"},
    "linear": {"rope_type", "rope_theta", "partial_rotary_factor", "factor"},
    "llama3": {"rope_type", "rope_theta", "partial_rotary_factor", "factor", "low_freq_factor", "high_freq_factor",
               "original_max_position_embeddings"},
    "yarn": {"rope_type", "rope_theta", "partial_rotary_factor", "factor", "original_max_position_embeddings",
             "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"},
}
# transformers' default theta when a file gives none (PreTrainedConfig.default_theta; Gemma3's two)
_DEFAULT_THETA = 10000.0
_MAX_POSITIONS = {"llama": 2048, "qwen2": 32768, "qwen3": 32768, "mistral": 4096 * 32, "gemma": 8192,
                  "gemma3_text": 131_072}  # transformers' defaults
_GEMMA3_THETA = {"full_attention": 1_000_000.0, "sliding_attention": 10_000.0}


@dataclass(frozen=True)
class Rope:
    """One rotary embedding: ``inv_freq()`` (head_dim / 2 frequencies, transformers' formulas) and
    ``attention_factor`` (cos and sin are multiplied by it: yarn's mscale, 1 otherwise)."""

    rope_type: str  # default | linear | llama3 | yarn
    theta: float  # base
    head_dim: int  # rotated dimensions (the whole head)
    factor: float = 1.0  # linear, llama3, yarn
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    original_max_position_embeddings: int = 0  # llama3, yarn
    attention_factor: float = 1.0  # yarn: scales cos and sin
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    truncate: bool = True  # yarn

    def inv_freq(self) -> np.ndarray:
        """(head_dim // 2,) float32, as transformers computes it (float32 powers)."""
        dim = self.head_dim
        exponents = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)
        base = np.float32(1.0) / np.power(np.float32(self.theta), exponents, dtype=np.float32)
        if self.rope_type == "default":
            return base
        if self.rope_type == "linear":
            return (base / np.float32(self.factor)).astype(np.float32)
        if self.rope_type == "llama3":
            old = self.original_max_position_embeddings
            low_wavelen, high_wavelen = old / self.low_freq_factor, old / self.high_freq_factor
            wavelen = np.float32(2 * math.pi) / base
            scaled = np.where(wavelen > low_wavelen, base / np.float32(self.factor), base).astype(np.float32)
            smooth = ((old / wavelen - self.low_freq_factor) / (self.high_freq_factor - self.low_freq_factor))
            smoothed = (1 - smooth) * scaled / np.float32(self.factor) + smooth * scaled
            medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
            return np.where(medium, smoothed, scaled).astype(np.float32)
        # yarn
        pos_freqs = np.power(np.float32(self.theta), exponents, dtype=np.float32)
        extrapolation, interpolation = np.float32(1) / pos_freqs, np.float32(1) / (np.float32(self.factor) * pos_freqs)

        def correction_dim(rotations: float) -> float:
            return (dim * math.log(self.original_max_position_embeddings / (rotations * 2 * math.pi))) / (
                2 * math.log(self.theta))

        low, high = correction_dim(self.beta_fast), correction_dim(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1).astype(np.float32)
        keep = 1 - ramp
        return (interpolation * (1 - keep) + extrapolation * keep).astype(np.float32)


@dataclass(frozen=True)
class DecoderConfig:
    """What a Llama-like decoder builder needs, whatever the family and the spelling of its file."""

    family: str  # model_type
    vocab_size: int
    hidden_size: int
    intermediate_size: int  # the MLP's gate/up width
    num_layers: int
    num_heads: int  # query heads
    num_kv_heads: int  # key/value heads (divides num_heads; < num_heads: grouped-query attention)
    head_dim: int
    activation: str  # silu (SwiGLU) | gelu_tanh (GeGLU)
    rms_norm_eps: float
    norm_plus_one: bool  # Gemma: RMSNorm multiplies by (1 + weight)
    embed_scale: float  # embeddings times this (Gemma: sqrt(hidden_size), else 1)
    tie_word_embeddings: bool
    qkv_bias: bool  # q_proj, k_proj, v_proj have biases
    o_bias: bool  # o_proj has a bias
    mlp_bias: bool  # gate_proj, up_proj, down_proj have biases
    qk_norm: bool  # RMSNorm over head_dim on queries and keys (q_norm, k_norm)
    sandwich_norms: bool  # Gemma3: post_attention_layernorm after attention, pre/post_feedforward_layernorm
    attention_scale: float  # scores = q.k * this (head_dim**-0.5, Gemma3: query_pre_attn_scalar**-0.5)
    attn_logit_softcapping: float | None  # scores = cap * tanh(scores / cap) (always None today: see gemma3)
    final_logit_softcapping: float | None  # logits = cap * tanh(logits / cap)
    windows: tuple[int | None, ...]  # per layer: key j is seen by query i when i - window < j <= i; None: all
    ropes: tuple[Rope, ...]  # per layer
    max_position_embeddings: int
    dtype: str | None  # gputrain's precision name of the saved weights
    pad_token_id: int | None  # ...ForSequenceClassification pools the last token that is not this
    num_labels: int
    problem_type: str | None


def _attention_dropout(config: HFConfig) -> None:
    config.float("attention_dropout", 0.0, high=0.0)  # implemented only at 0


def _rope_dict(config: HFConfig, rope: dict[str, Any], name: str, head_dim: int, max_positions: int) -> Rope:
    def error(message: str) -> ValueError:
        return ValueError(f"{config.path}: field {name!r} {message}")

    kind = rope.get("rope_type", rope.get("type", "default"))
    rope = {("rope_type" if k == "type" else k): v for k, v in rope.items()}
    if kind not in _ROPE_KEYS:
        raise error(f"rope_type = {kind!r} is not supported (gputrain implements {', '.join(_ROPE_KEYS)})")
    unknown = sorted(set(rope) - _ROPE_KEYS[kind])
    if unknown:
        raise error(f"key {unknown[0]!r} is not known for rope_type {kind!r} (known: {sorted(_ROPE_KEYS[kind])})")

    def number(key: str, default: Any = None, low: float = 0.0, open_low: bool = True) -> float:
        value = rope.get(key, default)
        if value is None:
            raise error(f"needs {key!r} for rope_type {kind!r}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or \
                not (value > low if open_low else value >= low):
            raise error(f"{key!r} must be a number > {low}, got {value!r}")
        return float(value)

    if number("partial_rotary_factor", 1.0) != 1.0:
        raise error(f"partial_rotary_factor = {rope['partial_rotary_factor']!r} is not supported: these families "
                    "rotate the whole head (gputrain implements only 1.0)")
    theta = number("rope_theta")
    if kind == "default":
        return Rope("default", theta, head_dim)
    factor = number("factor")
    if kind == "linear":
        return Rope("linear", theta, head_dim, factor=factor)
    # transformers fills a missing original_max_position_embeddings with max_position_embeddings
    original = rope.get("original_max_position_embeddings", max_positions)
    if isinstance(original, bool) or not isinstance(original, int) or original < 1:
        raise error(f"'original_max_position_embeddings' must be an integer >= 1, got {original!r}")
    if kind == "llama3":
        low, high = number("low_freq_factor"), number("high_freq_factor")
        if high <= low:
            raise error(f"needs high_freq_factor > low_freq_factor, got {high} and {low}")
        return Rope("llama3", theta, head_dim, factor=factor, low_freq_factor=low, high_freq_factor=high,
                    original_max_position_embeddings=original)
    truncate = rope.get("truncate", True)
    if not isinstance(truncate, bool):
        raise error(f"'truncate' must be true or false, got {truncate!r}")
    attention = rope.get("attention_factor")
    mscale, mscale_all = rope.get("mscale"), rope.get("mscale_all_dim")

    def get_mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if attention is not None:
        attention = number("attention_factor")
    elif mscale and mscale_all:
        attention = get_mscale(factor, number("mscale")) / get_mscale(factor, number("mscale_all_dim"))
    else:
        attention = get_mscale(factor)
    return Rope("yarn", theta, head_dim, factor=factor, original_max_position_embeddings=original,
                attention_factor=float(attention), truncate=truncate,  # beta 0 or null: the default, as transformers
                beta_fast=number("beta_fast") if rope.get("beta_fast") else 32.0,
                beta_slow=number("beta_slow") if rope.get("beta_slow") else 1.0)


def _single_rope(config: HFConfig, head_dim: int, max_positions: int) -> Rope:
    rope = config.rope_parameters()
    if rope is None:
        rope = {"rope_type": "default"}
    rope.setdefault("rope_theta", _DEFAULT_THETA)
    if any(isinstance(v, dict) for v in rope.values()):
        raise ValueError(f"{config.path}: field 'rope_parameters' is nested by layer type, which this family "
                         "does not have")
    return _rope_dict(config, rope, "rope_parameters", head_dim, max_positions)


def _gemma3_ropes(config: HFConfig, head_dim: int, max_positions: int) -> dict[str, Rope]:
    new = config.raw("rope_parameters", None)
    scaling = config.raw("rope_scaling", None)
    theta, local = config.raw("rope_theta", None), config.raw("rope_local_base_freq", None)
    if new is not None and (not isinstance(new, dict) or set(new) - set(LAYER_TYPES)):
        raise ValueError(f"{config.path}: field 'rope_parameters' must be an object with keys "
                         f"{', '.join(LAYER_TYPES)}, got {new!r}")
    if scaling is not None and not isinstance(scaling, dict):
        raise ValueError(f"{config.path}: field 'rope_scaling' must be an object or null, got {scaling!r}")
    ropes = {}
    for kind in LAYER_TYPES:
        given = dict((new or {}).get(kind) or {"rope_type": "default"})
        old: dict[str, Any] = {}
        if kind == "full_attention":
            old.update({("rope_type" if k == "type" else k): v for k, v in (scaling or {}).items()})
            if theta is not None:
                old["rope_theta"] = theta
        elif local is not None:
            old["rope_theta"] = local
        for key, value in old.items():
            if new is not None and key in given and given[key] != value:
                raise ValueError(f"{config.path}: field 'rope_parameters' disagrees with the older spelling on "
                                 f"{kind}.{key}: {given[key]!r} and {value!r}")
        merged = {**given, **old}
        merged.setdefault("rope_theta", _GEMMA3_THETA[kind])
        ropes[kind] = _rope_dict(config, merged, f"rope_parameters.{kind}", head_dim, max_positions)
    return ropes


def _layer_types(config: HFConfig, layers: int, computed: list[str]) -> list[str]:
    types = config.raw("layer_types", None)
    if types is None:
        return computed
    if not isinstance(types, list) or len(types) != layers or any(t not in LAYER_TYPES for t in types):
        raise ValueError(f"{config.path}: field 'layer_types' must list {layers} of {', '.join(LAYER_TYPES)}, "
                         f"got {types!r}")
    return types


def parse_decoder_config(config: HFConfig) -> DecoderConfig:
    """Reads every field of a Llama-like decoder's config.json (ValueError naming a field that is
    refused or unknown); builds nothing."""
    family = config.raw("model_type")
    if family not in FAMILY_NAMES:
        raise ValueError(f"{config.path}: field 'model_type' = {family!r} is not one of {', '.join(FAMILY_NAMES)}")
    gemma = family in ("gemma", "gemma3_text")
    hidden = config.int("hidden_size")
    heads = config.int("num_attention_heads")
    kv = config.raw("num_key_value_heads", None)
    kv = heads if kv is None else config.int("num_key_value_heads")
    if heads % kv:
        raise ValueError(f"{config.path}: field 'num_key_value_heads' = {kv} must divide num_attention_heads = {heads}")
    layers = config.int("num_hidden_layers")
    if family == "qwen2":
        if hidden % heads:
            raise ValueError(f"{config.path}: field 'num_attention_heads' = {heads} must divide hidden_size = {hidden}")
        head_dim = hidden // heads
    else:
        default_dim = {"qwen3": 128, "gemma": 256, "gemma3_text": 256}.get(family)
        given = config.raw("head_dim", default_dim)
        head_dim = hidden // heads if given is None else config.int("head_dim", default_dim)
    if head_dim % 2:
        raise ValueError(f"{config.path}: field 'head_dim' = {head_dim} must be even (rotary embedding)")

    if family == "gemma3_text":
        activation = config.choice("hidden_activation", "gelu_pytorch_tanh", {"gelu_pytorch_tanh": "gelu_tanh"})
    elif family == "gemma":
        activation = config.choice("hidden_act", "gelu_pytorch_tanh", {"gelu_pytorch_tanh": "gelu_tanh",
                                                                      "gelu": "gelu_tanh"})
        config.at_default("hidden_activation", None)  # older files' spelling, which transformers 5 ignores
    else:
        activation = config.choice("hidden_act", "silu", {"silu": "silu"})
    if gemma:
        bidirectional = config.raw("use_bidirectional_attention", None if family == "gemma" else False)
        if bidirectional not in (None, False):
            raise ValueError(f"{config.path}: field 'use_bidirectional_attention' = {bidirectional!r} is not "
                             "supported: gputrain implements only causal attention")

    attention_bias = config.bool("attention_bias", False) if family != "qwen2" and family != "mistral" else False
    mlp_bias = config.bool("mlp_bias", False) if family == "llama" else False
    _attention_dropout(config)
    config.irrelevant("initializer_range", "use_cache", "pretraining_tp")

    if family in ("qwen2", "qwen3"):
        use_window = config.bool("use_sliding_window", False)
        window = config.raw("sliding_window", 4096)
        window = None if window is None else config.int("sliding_window", 4096)
        first = config.int("max_window_layers", 28, minimum=0)
        computed = ["sliding_attention" if use_window and window is not None and i >= first else "full_attention"
                    for i in range(layers)]
        types = _layer_types(config, layers, computed)
        if "sliding_attention" in types and not (use_window and window is not None):
            raise ValueError(f"{config.path}: field 'layer_types' has sliding layers but use_sliding_window is "
                             "false or sliding_window null")
        windows = [window if t == "sliding_attention" else None for t in types]
    elif family == "mistral":
        window = config.raw("sliding_window", 4096)
        window = None if window is None else config.int("sliding_window", 4096)
        windows = [window] * layers
    elif family == "gemma3_text":
        window = config.int("sliding_window", 4096)
        pattern = config.int("sliding_window_pattern", 6)
        config.irrelevant("_sliding_window_pattern")  # written by transformers 5, read by nothing
        computed = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
        types = _layer_types(config, layers, computed)
        windows = [window if t == "sliding_attention" else None for t in types]
    else:
        windows = [None] * layers

    max_positions = config.int("max_position_embeddings", _MAX_POSITIONS[family])
    if family == "gemma3_text":
        by_type = _gemma3_ropes(config, head_dim, max_positions)
        ropes = tuple(by_type[t] for t in types)
        scalar = config.float("query_pre_attn_scalar", 256, low=0.0, low_open=True)
        scale = scalar ** -0.5
        # transformers (5.25) never passes attn_logit_softcapping to Gemma3's attention, so a value
        # has no agreed meaning: accepted only at null
        if config.raw("attn_logit_softcapping", None) is not None:
            raise ValueError(f"{config.path}: field 'attn_logit_softcapping' = "
                             f"{config.values['attn_logit_softcapping']!r} is not supported: transformers' Gemma3 "
                             "ignores it, so gputrain implements only null")
        final = config.raw("final_logit_softcapping", None)
        caps = [None, None if final is None else config.float("final_logit_softcapping", None, low_open=True)]
    else:
        ropes = (_single_rope(config, head_dim, max_positions),) * layers
        scale, caps = head_dim ** -0.5, [None, None]

    num_labels = len(config.raw("id2label", {}) or {}) or config.raw("num_labels", 2)
    if isinstance(num_labels, bool) or not isinstance(num_labels, int) or num_labels < 1:
        raise ValueError(f"{config.path}: field 'num_labels' must be an integer >= 1, got {num_labels!r}")
    pad = config.raw("pad_token_id", 0 if gemma else None)
    if pad is not None and (isinstance(pad, bool) or not isinstance(pad, int) or pad < 0):
        raise ValueError(f"{config.path}: field 'pad_token_id' must be null or an integer >= 0, got {pad!r}")
    problem = config.choice("problem_type", None, {p: p for p in PROBLEM_TYPES})

    result = DecoderConfig(
        family=family, vocab_size=config.int("vocab_size"), hidden_size=hidden,
        intermediate_size=config.int("intermediate_size"), num_layers=layers, num_heads=heads, num_kv_heads=kv,
        head_dim=head_dim, activation=activation, rms_norm_eps=config.float("rms_norm_eps", 1e-6, low_open=True),
        norm_plus_one=gemma, embed_scale=float(np.float32(hidden ** 0.5)) if gemma else 1.0,
        tie_word_embeddings=config.bool("tie_word_embeddings", gemma),
        qkv_bias=attention_bias or family == "qwen2", o_bias=attention_bias, mlp_bias=mlp_bias,
        qk_norm=family in ("qwen3", "gemma3_text"), sandwich_norms=family == "gemma3_text",
        attention_scale=scale, attn_logit_softcapping=caps[0], final_logit_softcapping=caps[1],
        windows=tuple(windows), ropes=ropes,
        max_position_embeddings=max_positions, dtype=config.dtype(),
        pad_token_id=pad, num_labels=num_labels, problem_type=problem)
    config.finish(family)
    return result


def load_decoder_config(folder: str) -> DecoderConfig:
    """``parse_decoder_config`` of ``folder/config.json``."""
    return parse_decoder_config(HFConfig.load(folder))

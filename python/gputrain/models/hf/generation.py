"""``generate``: greedy decoding and sampling for the Llama-like decoder families of decoders.py
(llama, qwen2, qwen3, mistral, gemma, gemma3_text), over Hugging Face-named float32 weights.

The forward follows transformers' modeling_<family>.py in float32: embeddings (times
``embed_scale`` for Gemma), per layer an RMSNorm (Gemma: ``(1 + w)``), q/k/v projections (biases
where the config has them), QK-norm over head_dim (qwen3, gemma3), the layer's rotary embedding
(its own inv_freq and ``attention_factor``), grouped-query attention against a key/value cache
held at the KV head count (query head h reads kv head ``h // (heads / kv_heads)``, as
transformers' ``repeat_kv``, without ever copying a kv head per query head), the layer's sliding
window, ``o_proj``, the gated MLP (SwiGLU / GeGLU), Gemma3's sandwich norms, the final norm, a
tied or untied head and final logit soft-capping. GEMMs, RoPE and the gated activation run as
gputrain.functional ops; RMSNorm and the attention against the cache in NumPy.

Decoding follows transformers (5.25) ``GenerationMixin.generate`` with ``num_beams=1``:

- the result is the prompt followed by the new tokens (HF's layout), at most ``max_new_tokens``
  of them; with ``eos_token_id`` a row is finished once it produced one of them, every later token
  of that row is ``pad_token_id`` (default: the first EOS id, as HF), and generation stops as soon
  as every row is finished (so the result can be shorter than prompt + max_new_tokens);
- batched prompts are LEFT-padded, ``attention_mask`` 0 on the padding (without one, as
  transformers: ``input_ids != pad_token_id`` when the pad token occurs and is not an EOS id): position ids are
  ``cumsum(mask) - 1`` (padding positions get 0, as transformers 5.25 writes them; they never reach
  a real token), each new token's position is the row's last one + 1, padding keys are never
  attended to, and the sliding window counts cache indices (padding included), as transformers'
  masks do;
- greedy (argmax) unless ``do_sample``; sampling applies HF's logits warpers in HF's order --
  temperature, top_k, top_p -- then draws from the softmax with a NumPy Generator seeded with
  ``seed`` (the same seed gives the same tokens; they are not torch's draws). ``top_k=1`` takes the
  argmax. Unlike HF's GenerationConfig, whose default top_k is 50, ``top_k=None`` filters nothing.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from gputrain import functional as F
from gputrain.models.hf.decoders import DecoderConfig, Rope

# ---- arguments -----------------------------------------------------------------------------------


def expected_params(config: DecoderConfig) -> dict[str, tuple[int, ...]]:
    """{HF name: shape} of a ...ForCausalLM checkpoint of ``config`` (lm_head only when untied)."""
    c = config
    q_out, kv_out = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (c.vocab_size, c.hidden_size)}
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        norms = ["input_layernorm", "post_attention_layernorm"]
        if c.sandwich_norms:
            norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
        shapes.update({p + n + ".weight": (c.hidden_size,) for n in norms})
        linears = {"self_attn.q_proj": (q_out, c.hidden_size, c.qkv_bias),
                   "self_attn.k_proj": (kv_out, c.hidden_size, c.qkv_bias),
                   "self_attn.v_proj": (kv_out, c.hidden_size, c.qkv_bias),
                   "self_attn.o_proj": (c.hidden_size, q_out, c.o_bias),
                   "mlp.gate_proj": (c.intermediate_size, c.hidden_size, c.mlp_bias),
                   "mlp.up_proj": (c.intermediate_size, c.hidden_size, c.mlp_bias),
                   "mlp.down_proj": (c.hidden_size, c.intermediate_size, c.mlp_bias)}
        for name, (out, inp, bias) in linears.items():
            shapes[p + name + ".weight"] = (out, inp)
            if bias:
                shapes[p + name + ".bias"] = (out,)
        if c.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (c.head_dim,)
            shapes[p + "self_attn.k_norm.weight"] = (c.head_dim,)
    shapes["model.norm.weight"] = (c.hidden_size,)
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, c.hidden_size)
    return shapes


def _check_params(config: DecoderConfig, params: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """float32 C-contiguous copies of exactly the expected tensors (ValueError naming a missing,
    unexpected or misshapen one)."""
    if not isinstance(params, Mapping):
        raise TypeError(f"params must be a mapping of HF names to arrays, not {type(params).__name__}")
    expected = expected_params(config)
    unexpected = sorted(set(params) - set(expected))
    if unexpected:
        why = " (the config ties the head to model.embed_tokens.weight)" if unexpected[0] == "lm_head.weight" else ""
        raise ValueError(f"params: unexpected tensor {unexpected[0]!r} for this {config.family} config{why}")
    out = {}
    for name, shape in expected.items():
        if name not in params:
            raise ValueError(f"params: tensor {name!r} is missing")
        try:
            array = np.ascontiguousarray(params[name], dtype=np.float32)
        except (TypeError, ValueError) as error:
            raise TypeError(f"params[{name!r}]: not an array of numbers ({error})") from None
        if array.shape != shape:
            raise ValueError(f"params[{name!r}] has shape {array.shape}, the config implies {shape}")
        out[name] = array
    return out


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _token_ids(value: Any, name: str, vocab_size: int) -> np.ndarray:
    ids = np.asarray(value)
    if ids.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integer token ids, not {ids.dtype}")
    if ids.ndim != 2 or 0 in ids.shape:
        raise ValueError(f"{name} must be (batch, seq) with batch, seq >= 1 (or (seq,)), got shape {ids.shape}")
    if ids.min() < 0 or ids.max() >= vocab_size:
        raise ValueError(f"{name} must be in [0, {vocab_size}) (vocab_size), got values in [{ids.min()}, {ids.max()}]")
    return ids.astype(np.int64)


def _inferred_mask(ids: np.ndarray, pad: int | None, eos: tuple[int, ...] | None) -> np.ndarray | None:
    """transformers' attention mask when none is given: ids != pad where the pad token occurs in
    the prompts and is not an EOS token, else None (all ones)."""
    if pad is None or not (ids == pad).any() or (eos is not None and pad in eos):
        return None
    return (ids != pad).astype(np.int64)


def _left_padding_mask(mask: Any, shape: tuple[int, ...], name: str = "attention_mask") -> np.ndarray:
    """(B, T) int64 of 0/1, each row zeros then ones with at least one 1 (left padding)."""
    if mask is None:
        return np.ones(shape, dtype=np.int64)
    array = np.asarray(mask)
    if array.dtype.kind not in "iub":
        raise TypeError(f"{name} must hold 0/1 integers or booleans, not {array.dtype}")
    array = array.reshape((1, -1)) if array.ndim == 1 and len(shape) == 2 and shape[0] == 1 else array
    if array.shape != shape:
        raise ValueError(f"{name} must have input_ids' shape {shape}, got {array.shape}")
    if not np.isin(array, (0, 1)).all():
        raise ValueError(f"{name} must hold only 0 and 1")
    array = array.astype(np.int64)
    for row in range(shape[0]):
        if not array[row].any():
            raise ValueError(f"{name} row {row} is all 0: a prompt needs at least one token")
        if (np.diff(array[row]) < 0).any():
            raise ValueError(f"{name} row {row} is not left-padded (a 0 after a 1): decoder-only "
                             "generation appends after each row's last token, so pad on the left")
    return array


def _token_list(value: Any, name: str, vocab_size: int) -> tuple[int, ...] | None:
    if value is None:
        return None
    items = [value] if _is_int(value) else list(value) if isinstance(value, Iterable) else [value]
    if not items or not all(_is_int(v) and 0 <= v < vocab_size for v in items):
        raise ValueError(f"{name} must be None, an int or a non-empty list of ints in [0, {vocab_size}) "
                         f"(vocab_size), got {value!r}")
    return tuple(int(v) for v in items)


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen: argmax unless ``do_sample``; HF's warpers otherwise."""

    do_sample: bool
    temperature: float  # > 0
    top_k: int | None  # None or 0: no top-k filter
    top_p: float | None  # None or 1: no nucleus filter


def _sampling(do_sample: Any, temperature: Any, top_k: Any, top_p: Any) -> Sampling:
    if not isinstance(do_sample, (bool, np.bool_)):
        raise TypeError(f"do_sample must be a bool, got {do_sample!r}")
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) or \
            not math.isfinite(temperature) or temperature <= 0:
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    if top_k is not None and (not _is_int(top_k) or top_k < 0):
        raise ValueError(f"top_k must be None or an int >= 0 (0 or None: no top-k filter), got {top_k!r}")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, numbers.Real)
                              or not 0.0 <= top_p <= 1.0):
        raise ValueError(f"top_p must be None or a number in [0, 1], got {top_p!r}")
    return Sampling(bool(do_sample), float(temperature), None if top_k is None else int(top_k),
                    None if top_p is None else float(top_p))


# ---- the decoder's forward, one layer concern at a time ---------------------------------------


def _rms_norm(x: np.ndarray, weight: np.ndarray, eps: float, plus_one: bool) -> np.ndarray:
    """transformers' RMSNorm in float32: x * rsqrt(mean(x^2) + eps) * w (Gemma: * (1 + w))."""
    scaled = x * (np.float32(1.0) / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(eps)))
    return scaled * ((np.float32(1.0) + weight) if plus_one else weight)


def _linear(x: np.ndarray, params: Mapping[str, np.ndarray], name: str) -> np.ndarray:
    return F.linear(x, params[name + ".weight"], params.get(name + ".bias"))


def _rotate(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray, attention_factor: float) -> np.ndarray:
    """RoPE of x (B, n, heads, D) at positions (B, n), cos and sin times attention_factor (yarn)."""
    out = F.rotary_embedding(x, positions, inv_freq, layout="bthd")
    return out if attention_factor == 1.0 else out * np.float32(attention_factor)


@functools.lru_cache(maxsize=64)
def _inv_freq(rope: Rope) -> np.ndarray:
    """The rope's inverse frequencies, computed once per Rope (read-only)."""
    inv_freq = rope.inv_freq()
    inv_freq.setflags(write=False)
    return inv_freq


def _visible(mask: np.ndarray, start: int, new: int, window: int | None) -> np.ndarray:
    """(B, new, L) bool: query start + t sees key j when j <= start + t, mask[b, j] == 1 and, with
    a window, j > start + t - window (transformers' sliding rule, on cache indices)."""
    length = start + new
    query = start + np.arange(new)[:, None]
    key = np.arange(length)[None, :]
    allowed = key <= query
    if window is not None:
        allowed = allowed & (key > query - window)
    return allowed[None] & mask[:, None, :length].astype(bool)


def _softmax_visible(scores: np.ndarray, visible: np.ndarray) -> np.ndarray:
    """Softmax over the last axis of the visible scores; a query seeing no key (left padding)
    gets all-zero weights."""
    scores = np.where(visible, scores, -np.inf)
    peak = scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores - np.where(np.isfinite(peak), peak, 0))
    total = probs.sum(axis=-1, keepdims=True)
    return probs / np.where(total > 0, total, 1)


class KVCache:
    """Keys and values of every layer at the KV head count: (B, kv_heads, capacity, head_dim)."""

    def __init__(self, config: DecoderConfig, batch: int, capacity: int) -> None:
        shape = (batch, config.num_kv_heads, capacity, config.head_dim)
        self.keys = [np.zeros(shape, np.float32) for _ in range(config.num_layers)]
        self.values = [np.zeros(shape, np.float32) for _ in range(config.num_layers)]

    def store(self, layer: int, start: int, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Writes k, v (B, n, kv_heads, D) at [start, start + n); returns the layer's keys and
        values [0, start + n)."""
        end = start + k.shape[1]
        self.keys[layer][:, :, start:end] = k.transpose(0, 2, 1, 3)
        self.values[layer][:, :, start:end] = v.transpose(0, 2, 1, 3)
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]


def _grouped_attention(config: DecoderConfig, q: np.ndarray, keys: np.ndarray, values: np.ndarray,
                       visible: np.ndarray) -> np.ndarray:
    """q (B, n, H, D) against keys/values (B, K, L, D) -> (B, n, H*D). Query heads are grouped
    (B, K, H/K, n, D) and each group multiplies its one kv head (broadcast, never copied)."""
    batch, new, heads, dim = q.shape
    kv = config.num_kv_heads
    grouped = q.reshape(batch, new, kv, heads // kv, dim).transpose(0, 2, 3, 1, 4)  # (B, K, G, n, D)
    scores = (grouped @ keys[:, :, None].swapaxes(-1, -2)) * np.float32(config.attention_scale)  # (B, K, G, n, L)
    if config.attn_logit_softcapping is not None:
        cap = np.float32(config.attn_logit_softcapping)
        scores = np.tanh(scores / cap) * cap
    probs = _softmax_visible(scores, visible[:, None, None])
    out = probs.astype(np.float32) @ values[:, :, None]  # (B, K, G, n, D)
    return np.ascontiguousarray(out.transpose(0, 3, 1, 2, 4)).reshape(batch, new, heads * dim)


def _attention(config: DecoderConfig, params: Mapping[str, np.ndarray], layer: int, x: np.ndarray,
               positions: np.ndarray, mask: np.ndarray, cache: KVCache, start: int) -> np.ndarray:
    """One self-attention block over the new positions x (B, n, E), the cache extended by them."""
    c, p = config, f"model.layers.{layer}.self_attn."
    batch, new, _ = x.shape
    q = _linear(x, params, p + "q_proj").reshape(batch, new, c.num_heads, c.head_dim)
    k = _linear(x, params, p + "k_proj").reshape(batch, new, c.num_kv_heads, c.head_dim)
    v = _linear(x, params, p + "v_proj").reshape(batch, new, c.num_kv_heads, c.head_dim)
    if c.qk_norm:
        q = _rms_norm(q, params[p + "q_norm.weight"], c.rms_norm_eps, c.norm_plus_one)
        k = _rms_norm(k, params[p + "k_norm.weight"], c.rms_norm_eps, c.norm_plus_one)
    rope = c.ropes[layer]
    inv_freq = _inv_freq(rope)
    q = _rotate(q, positions, inv_freq, rope.attention_factor)
    k = _rotate(k, positions, inv_freq, rope.attention_factor)
    keys, values = cache.store(layer, start, k, v)
    out = _grouped_attention(c, q, keys, values, _visible(mask, start, new, c.windows[layer]))
    return _linear(out, params, p + "o_proj")


def _mlp(config: DecoderConfig, params: Mapping[str, np.ndarray], layer: int, x: np.ndarray) -> np.ndarray:
    """down_proj(act(gate_proj(x)) * up_proj(x)) with the fused gated activation."""
    p = f"model.layers.{layer}.mlp."
    gate_up = np.concatenate([_linear(x, params, p + "gate_proj"), _linear(x, params, p + "up_proj")], axis=-1)
    return _linear(F.gated_activation(gate_up, config.activation), params, p + "down_proj")


def _decoder_layer(config: DecoderConfig, params: Mapping[str, np.ndarray], layer: int, x: np.ndarray,
                   positions: np.ndarray, mask: np.ndarray, cache: KVCache, start: int) -> np.ndarray:
    c, p = config, f"model.layers.{layer}."

    def norm(h: np.ndarray, name: str) -> np.ndarray:
        return _rms_norm(h, params[p + name + ".weight"], c.rms_norm_eps, c.norm_plus_one)

    attended = _attention(c, params, layer, norm(x, "input_layernorm"), positions, mask, cache, start)
    if c.sandwich_norms:  # Gemma3: a norm after attention and one before and after the MLP
        x = x + norm(attended, "post_attention_layernorm")
        return x + norm(_mlp(c, params, layer, norm(x, "pre_feedforward_layernorm")), "post_feedforward_layernorm")
    x = x + attended
    return x + _mlp(c, params, layer, norm(x, "post_attention_layernorm"))


def _lm_head(config: DecoderConfig, params: Mapping[str, np.ndarray], hidden: np.ndarray) -> np.ndarray:
    """Final norm, head (tied or not) and soft-capping: (..., E) -> (..., V) float32."""
    normed = _rms_norm(hidden, params["model.norm.weight"], config.rms_norm_eps, config.norm_plus_one)
    head = params["model.embed_tokens.weight" if config.tie_word_embeddings else "lm_head.weight"]
    logits = F.linear(normed, head)
    if config.final_logit_softcapping is not None:
        cap = np.float32(config.final_logit_softcapping)
        logits = np.tanh(logits / cap) * cap
    return logits


def forward(config: DecoderConfig, params: Mapping[str, np.ndarray], ids: np.ndarray, positions: np.ndarray,
            mask: np.ndarray, cache: KVCache, start: int, all_logits: bool = False) -> np.ndarray:
    """Logits of the new tokens ids (B, n) at cache indices [start, start + n) with their positions
    (B, n), ``mask`` (B, >= start + n) the 0/1 key mask of every cache index; the cache is extended.
    Returns (B, n, V) with all_logits, else (B, V) of the last new token. ``params`` as
    _check_params returns them."""
    x = params["model.embed_tokens.weight"][ids]
    if config.embed_scale != 1.0:
        x = x * np.float32(config.embed_scale)
    for layer in range(config.num_layers):
        x = _decoder_layer(config, params, layer, x, positions, mask, cache, start)
    return _lm_head(config, params, x if all_logits else x[:, -1])


# ---- choosing the next token --------------------------------------------------------------------


def _warp(logits: np.ndarray, sampling: Sampling) -> np.ndarray:
    """HF's logits warpers in HF's order on (B, V) float32 scores: temperature, top_k, top_p;
    removed tokens get -inf."""
    scores = logits / np.float32(sampling.temperature) if sampling.temperature != 1.0 else logits
    if sampling.top_k:  # TopKLogitsWarper: keep scores >= the k-th largest (ties kept)
        k = min(sampling.top_k, scores.shape[-1])
        kth = np.partition(scores, -k, axis=-1)[:, -k:].min(axis=-1, keepdims=True)
        scores = np.where(scores < kth, -np.inf, scores)
    if sampling.top_p is not None and sampling.top_p < 1.0:  # TopPLogitsWarper
        order = np.argsort(scores, axis=-1, kind="stable")  # ascending
        ascending = np.take_along_axis(scores, order, axis=-1)
        cumulative = np.cumsum(_softmax(ascending), axis=-1)
        remove = cumulative <= np.float32(1.0 - sampling.top_p)
        remove[:, -1] = False  # min_tokens_to_keep = 1
        removed = np.zeros_like(remove)
        np.put_along_axis(removed, order, remove, axis=-1)
        scores = np.where(removed, -np.inf, scores)
    return scores


def _softmax(scores: np.ndarray) -> np.ndarray:
    shifted = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def _draw(probs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One index per row of (B, V) probabilities, by inverting the float64 CDF (a token of
    probability 0 is never drawn)."""
    cdf = np.cumsum(probs.astype(np.float64), axis=-1)
    draws = rng.random(len(cdf)) * cdf[:, -1]
    picked = (cdf <= draws[:, None]).sum(axis=-1)  # the first index whose CDF passes the draw
    last_nonzero = probs.shape[-1] - 1 - np.argmax(probs[:, ::-1] > 0, axis=-1)
    return np.minimum(picked, last_nonzero)


def next_tokens(logits: np.ndarray, sampling: Sampling, rng: np.random.Generator | None) -> np.ndarray:
    """(B,) int64 next tokens of (B, V) logits: argmax when greedy or top_k == 1, else a draw from
    the warped distribution."""
    if not sampling.do_sample or sampling.top_k == 1:
        return np.argmax(logits, axis=-1).astype(np.int64)
    return _draw(_softmax(_warp(logits.astype(np.float32), sampling)), rng).astype(np.int64)


# ---- the loop ------------------------------------------------------------------------------------


def prompt_positions(mask: np.ndarray) -> np.ndarray:
    """transformers' generation position ids: cumsum(mask) - 1, 0 on left padding."""
    return np.where(mask == 1, np.cumsum(mask, axis=-1) - 1, 0).astype(np.int64)


def generate(config: DecoderConfig, params: Mapping[str, Any], input_ids: Any, max_new_tokens: int, *,
             attention_mask: Any = None, do_sample: bool = False, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, eos_token_id: int | Iterable[int] | None = None,
             pad_token_id: int | None = None, seed: int | None = None) -> np.ndarray:
    """The prompts ``input_ids`` ((batch, seq) or (seq,) int ids; batches left-padded with
    ``attention_mask``) followed by up to ``max_new_tokens`` new tokens each, int64 of the same
    rank (module docstring: greedy unless do_sample, HF's warpers, EOS stopping, padding).

    config: a DecoderConfig (decoders.load_decoder_config); params: {HF name: array} with exactly
    the tensors of expected_params(config), converted to float32. Every argument is checked before
    anything runs (TypeError / ValueError naming it)."""
    if not isinstance(config, DecoderConfig):
        raise TypeError(f"config must be a DecoderConfig (decoders.load_decoder_config), not {type(config).__name__}")
    try:
        given = np.asarray(input_ids)
    except ValueError as error:  # ragged nested lists
        raise ValueError(f"input_ids must be a (batch, seq) array of token ids, got {error}") from None
    squeeze = given.ndim == 1
    ids = _token_ids(given[None] if squeeze else given, "input_ids", config.vocab_size)
    if not _is_int(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    sampling = _sampling(do_sample, temperature, top_k, top_p)
    eos = _token_list(eos_token_id, "eos_token_id", config.vocab_size)
    if pad_token_id is not None and not (_is_int(pad_token_id) and 0 <= pad_token_id < config.vocab_size):
        raise ValueError(f"pad_token_id must be None or an int in [0, {config.vocab_size}) (vocab_size), "
                         f"got {pad_token_id!r}")
    if seed is not None and (not _is_int(seed) or seed < 0):
        raise ValueError(f"seed must be None or an int >= 0, got {seed!r}")
    pad = int(pad_token_id) if pad_token_id is not None else (eos[0] if eos else None)
    if attention_mask is None and (inferred := _inferred_mask(ids, pad, eos)) is not None:
        mask = _left_padding_mask(inferred, ids.shape, f"attention_mask (none given: inferred as input_ids != "
                                                       f"pad_token_id {pad}, as transformers does)")
    else:
        mask = _left_padding_mask(attention_mask, ids.shape)
    weights = _check_params(config, params)
    rng = np.random.default_rng(seed) if sampling.do_sample else None
    out = _decode(config, weights, ids, mask, int(max_new_tokens), sampling, eos, pad, rng)
    return out[0] if squeeze else out


def _decode(config: DecoderConfig, params: Mapping[str, np.ndarray], ids: np.ndarray, mask: np.ndarray,
            max_new: int, sampling: Sampling, eos: tuple[int, ...] | None, pad: int | None,
            rng: np.random.Generator | None) -> np.ndarray:
    """The prompt, then one token per step against the cache, until max_new or every row's EOS."""
    batch, length = ids.shape
    out = np.concatenate([ids, np.zeros((batch, max_new), np.int64)], axis=1)
    full_mask = np.concatenate([mask, np.ones((batch, max_new), np.int64)], axis=1)
    cache = KVCache(config, batch, length + max_new)
    positions = prompt_positions(mask)
    logits = forward(config, params, ids, positions, full_mask, cache, 0)
    unfinished = np.ones(batch, dtype=bool)
    for step in range(max_new):
        chosen = next_tokens(logits, sampling, rng)
        if eos is not None:
            chosen = np.where(unfinished, chosen, pad)
            unfinished &= ~np.isin(chosen, eos)
        out[:, length + step] = chosen
        if not unfinished.any() or step + 1 == max_new:
            return out[:, :length + step + 1]
        positions = positions[:, -1:] + 1
        logits = forward(config, params, chosen[:, None], positions, full_mask, cache, length + step)
    return out

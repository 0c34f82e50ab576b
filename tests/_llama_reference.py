"""A NumPy (float64) forward of the Llama-like decoders, independent of gputrain's kernels, written
from transformers' modeling_<family>.py: RMSNorm (Gemma's (1 + w)), rotate_half RoPE (inv_freq
from the parsed config: default, linear, llama3, yarn with its cos/sin factor), grouped-query
attention with a causal mask, key padding, per-layer sliding windows and packed rows (documents
found from restarting position_ids, as transformers does when attention_mask is None), QK-norm,
Gemma3's sandwich norms, query_pre_attn_scalar and logit soft-capping, SwiGLU / GeGLU MLPs with
optional biases, a tied or untied head, and ...ForSequenceClassification's last-non-pad pooling.

It reads the weights from a folder with gputrain's safetensors reader and the config with
gputrain.models.hf.decoders, so a check against transformers' committed logits tests the fixtures,
the config parsing, and this reference at once.
"""

from __future__ import annotations

import numpy as np

from gputrain.models.hf.decoders import DecoderConfig, load_decoder_config
from gputrain.models.hf.safetensors_io import checkpoint_tensors, read_tensor


def load(folder: str) -> tuple[DecoderConfig, dict[str, np.ndarray]]:
    weights = {name: read_tensor(ref).astype(np.float64) for name, ref in checkpoint_tensors(folder).items()}
    return load_decoder_config(folder), weights


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float, plus_one: bool) -> np.ndarray:
    x = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return x * ((1.0 + weight) if plus_one else weight)


def linear(x: np.ndarray, w: dict, name: str) -> np.ndarray:
    y = x @ w[name + ".weight"].T
    return y + w[name + ".bias"] if name + ".bias" in w else y


def rotate_half(x: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def attention_allowed(positions: np.ndarray, mask: np.ndarray | None, window: int | None) -> np.ndarray:
    """(B, S, S) bool: query i sees key j."""
    batch, seq = positions.shape
    i, j = np.arange(seq)[:, None], np.arange(seq)[None, :]
    allowed = np.broadcast_to(j <= i, (batch, seq, seq)).copy()
    if window is not None:
        allowed &= j > i - window
    if mask is not None:
        allowed &= mask[:, None, :].astype(bool)
    else:  # packed rows: a new document wherever the position does not go up by one
        starts = np.concatenate([np.zeros((batch, 1), bool), np.diff(positions, axis=1) != 1], axis=1)
        doc = np.cumsum(starts, axis=1)
        allowed &= doc[:, :, None] == doc[:, None, :]
    return allowed


def attention(cfg: DecoderConfig, w: dict, p: str, x: np.ndarray, layer: int, positions: np.ndarray,
              mask: np.ndarray | None) -> np.ndarray:
    batch, seq, _ = x.shape
    heads, kv, dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    q = linear(x, w, p + "q_proj").reshape(batch, seq, heads, dim)
    k = linear(x, w, p + "k_proj").reshape(batch, seq, kv, dim)
    v = linear(x, w, p + "v_proj").reshape(batch, seq, kv, dim)
    if cfg.qk_norm:
        q = rms_norm(q, w[p + "q_norm.weight"], cfg.rms_norm_eps, cfg.norm_plus_one)
        k = rms_norm(k, w[p + "k_norm.weight"], cfg.rms_norm_eps, cfg.norm_plus_one)
    rope = cfg.ropes[layer]
    freqs = positions[..., None].astype(np.float64) * rope.inv_freq().astype(np.float64)  # (B, S, D/2)
    angles = np.concatenate([freqs, freqs], axis=-1)[:, :, None, :]
    cos, sin = np.cos(angles) * rope.attention_factor, np.sin(angles) * rope.attention_factor
    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    group = heads // kv
    k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)  # query head h uses kv head h // group
    scores = np.einsum("bihd,bjhd->bhij", q, k) * cfg.attention_scale
    if cfg.attn_logit_softcapping is not None:
        scores = cfg.attn_logit_softcapping * np.tanh(scores / cfg.attn_logit_softcapping)
    allowed = attention_allowed(positions, mask, cfg.windows[layer])[:, None]
    # A query that sees no key (a left-padding position) attends to every key equally: transformers'
    # eager attention adds float32's minimum to masked scores, which absorbs the scores. Those rows'
    # logits are meaningless, but the loss at the last padding position (predicting the first real
    # token) uses them, so the reference reproduces them.
    blind = ~allowed.any(-1, keepdims=True)
    allowed = allowed | blind
    scores = np.where(allowed, scores, -np.inf)
    scores = np.where(blind, 0.0, scores - np.max(scores, axis=-1, keepdims=True))
    probs = np.where(allowed, np.exp(scores), 0.0)
    probs /= probs.sum(-1, keepdims=True)
    out = np.einsum("bhij,bjhd->bihd", probs, v).reshape(batch, seq, heads * dim)
    return linear(out, w, p + "o_proj")


def mlp(cfg: DecoderConfig, w: dict, p: str, x: np.ndarray) -> np.ndarray:
    gate = linear(x, w, p + "gate_proj")
    act = gate / (1.0 + np.exp(-gate)) if cfg.activation == "silu" else gelu_tanh(gate)
    return linear(act * linear(x, w, p + "up_proj"), w, p + "down_proj")


def hidden_states(cfg: DecoderConfig, w: dict, ids: np.ndarray, mask: np.ndarray | None = None,
                  positions: np.ndarray | None = None) -> np.ndarray:
    """The final norm's output, (B, S, hidden). Without position_ids, positions are 0..S-1 (as
    transformers' forward does, whatever the padding)."""
    if positions is None:
        positions = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
    eps, plus = cfg.rms_norm_eps, cfg.norm_plus_one
    x = w["model.embed_tokens.weight"][ids] * cfg.embed_scale
    for layer in range(cfg.num_layers):
        p = f"model.layers.{layer}."
        h = attention(cfg, w, p + "self_attn.", rms_norm(x, w[p + "input_layernorm.weight"], eps, plus),
                      layer, positions, mask)
        if cfg.sandwich_norms:
            x = x + rms_norm(h, w[p + "post_attention_layernorm.weight"], eps, plus)
            h = mlp(cfg, w, p + "mlp.", rms_norm(x, w[p + "pre_feedforward_layernorm.weight"], eps, plus))
            x = x + rms_norm(h, w[p + "post_feedforward_layernorm.weight"], eps, plus)
        else:
            x = x + h
            x = x + mlp(cfg, w, p + "mlp.", rms_norm(x, w[p + "post_attention_layernorm.weight"], eps, plus))
    return rms_norm(x, w["model.norm.weight"], eps, plus)


def causal_lm_logits(cfg: DecoderConfig, w: dict, ids: np.ndarray, mask: np.ndarray | None = None,
                     positions: np.ndarray | None = None) -> np.ndarray:
    head = w["model.embed_tokens.weight"] if cfg.tie_word_embeddings else w["lm_head.weight"]
    logits = hidden_states(cfg, w, ids, mask, positions) @ head.T
    if cfg.final_logit_softcapping is not None:
        logits = cfg.final_logit_softcapping * np.tanh(logits / cfg.final_logit_softcapping)
    return logits


def cross_entropy(logits: np.ndarray, targets: np.ndarray) -> float:
    """Mean over targets != -100."""
    keep = targets != -100
    logits, targets = logits[keep], targets[keep]
    shifted = logits - logits.max(-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    return float(-logp[np.arange(len(targets)), targets].mean())


def causal_lm_loss(logits: np.ndarray, labels: np.ndarray) -> float:
    """transformers' ForCausalLM loss: position t predicts labels[t + 1]."""
    return cross_entropy(logits[:, :-1], labels[:, 1:])


def sequence_classification(cfg: DecoderConfig, w: dict, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """(B, num_labels): score of the rightmost token whose id is not pad_token_id."""
    scores = hidden_states(cfg, w, ids, mask) @ w["score.weight"].T
    last = (np.arange(ids.shape[1]) * (ids != cfg.pad_token_id)).argmax(-1)
    return scores[np.arange(len(ids)), last]


def greedy(cfg: DecoderConfig, w: dict, prompt: np.ndarray, new_tokens: int) -> np.ndarray:
    ids = prompt
    for _ in range(new_tokens):
        ids = np.concatenate([ids, causal_lm_logits(cfg, w, ids)[:, -1].argmax(-1)[:, None]], axis=1)
    return ids

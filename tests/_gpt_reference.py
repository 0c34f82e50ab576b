"""A float64 NumPy reference of gputrain.models.GPT (forward and backward of the whole model and
its mean cross-entropy, no dropout), written from GPT-2's math over the model's state_dict: the
token embedding's gradient is the sum of its lookup's and the tied LM head's."""

from __future__ import annotations

import numpy as np

import _attention_reference as aref
import _reference as ref
from _mlp_reference import gelu, gelu_grad

EPS = 1e-5


def _linear(x, p, name):
    y = x @ p[name + ".weight"].T
    return y + p[name + ".bias"] if name + ".bias" in p else y


def _linear_backward(dy, x, p, name, grads):
    grads[name + ".weight"] = dy.reshape(-1, dy.shape[-1]).T @ x.reshape(-1, x.shape[-1])
    if name + ".bias" in p:
        grads[name + ".bias"] = dy.reshape(-1, dy.shape[-1]).sum(0)
    return dy @ p[name + ".weight"]


def _ln(x, p, name):
    bias = p.get(name + ".bias", np.zeros_like(p[name + ".weight"]))
    return ref.layer_norm(x, p[name + ".weight"], bias, EPS)[0]


def _ln_backward(dy, x, p, name, grads):
    dx, dw, db = ref.layer_norm_backward(dy, x, p[name + ".weight"], EPS)
    grads[name + ".weight"] = dw
    if name + ".bias" in p:
        grads[name + ".bias"] = db
    return dx


def _heads(t, n_head):
    b, s, e = t.shape
    return t.reshape(b, s, n_head, e // n_head).transpose(0, 2, 1, 3)


def _merge(t):
    b, h, s, d = t.shape
    return t.transpose(0, 2, 1, 3).reshape(b, s, h * d)


def loss_and_grads(state, ids, targets, n_layer, n_head):
    """(mean cross-entropy, logits, {name: gradient}) in float64, and the two parts of the token
    embedding's gradient: (from the lookup, from the LM head)."""
    p = {k: ref.f64(v) for k, v in state.items()}
    seq, embed = ids.shape[1], p["wte.weight"].shape[1]
    x = p["wte.weight"][ids] + p["wpe.weight"][:seq]
    saved = []
    for i in range(n_layer):
        h = f"h.{i}."
        a = _ln(x, p, h + "ln_1")
        qkv = _linear(a, p, h + "attn.in_proj")
        q, k, v = (_heads(qkv[..., j * embed:(j + 1) * embed], n_head) for j in range(3))
        att = _merge(aref.attention(q, k, v, causal=True)[0])
        x1 = x + _linear(att, p, h + "attn.out_proj")
        m = _ln(x1, p, h + "ln_2")
        f = _linear(m, p, h + "mlp.c_fc")
        x2 = x1 + _linear(gelu(f, "tanh"), p, h + "mlp.c_proj")
        saved.append((x, a, q, k, v, att, x1, m, f))
        x = x2
    final = _ln(x, p, "ln_f")
    logits = final @ p["wte.weight"].T
    rows = logits.reshape(-1, logits.shape[-1])
    losses, dlogits, count = ref.cross_entropy(rows, targets.reshape(-1))
    grads: dict[str, np.ndarray] = {}
    dlogits = dlogits.reshape(logits.shape)
    head_part = dlogits.reshape(-1, dlogits.shape[-1]).T @ final.reshape(-1, embed)
    dx = _ln_backward(dlogits @ p["wte.weight"], x, p, "ln_f", grads)
    for i in reversed(range(n_layer)):
        h = f"h.{i}."
        x0, a, q, k, v, att, x1, m, f = saved[i]
        dg = _linear_backward(dx, gelu(f, "tanh"), p, h + "mlp.c_proj", grads)
        dm = _linear_backward(dg * gelu_grad(f, "tanh"), m, p, h + "mlp.c_fc", grads)
        dx1 = dx + _ln_backward(dm, x1, p, h + "ln_2", grads)
        datt = _linear_backward(dx1, att, p, h + "attn.out_proj", grads)
        dq, dk, dv = aref.attention_backward(_heads(datt, n_head), q, k, v, causal=True)
        dqkv = np.concatenate([_merge(dq), _merge(dk), _merge(dv)], axis=-1)
        da = _linear_backward(dqkv, a, p, h + "attn.in_proj", grads)
        dx = dx1 + _ln_backward(da, x0, p, h + "ln_1", grads)
    grads["wpe.weight"] = np.zeros_like(p["wpe.weight"])
    grads["wpe.weight"][:seq] = dx.sum(0)
    lookup_part = ref.embedding_backward(dx, ids, p["wte.weight"].shape[0])
    grads["wte.weight"] = lookup_part + head_part
    return losses.sum() / count, logits, grads, (lookup_part, head_part)

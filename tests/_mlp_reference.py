"""A float64 NumPy reference of gputrain.nn models (forward and backward), for the model tests."""

from __future__ import annotations

import math

import numpy as np

import _attention_reference as aref
import _cnn_reference as cnnref
import _conv_reference as cref
import gputrain as gt

_erf = np.vectorize(math.erf)


def gelu(x, approximate):
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1 + _erf(x / math.sqrt(2)))


def gelu_grad(x, approximate):
    if approximate == "tanh":
        k = math.sqrt(2 / math.pi)
        t = np.tanh(k * (x + 0.044715 * x**3))
        return 0.5 * (1 + t) + 0.5 * x * (1 - t**2) * k * (1 + 3 * 0.044715 * x**2)
    cdf = 0.5 * (1 + _erf(x / math.sqrt(2)))
    return cdf + x * np.exp(-0.5 * x**2) / math.sqrt(2 * math.pi)


def rms_weight(layer, params):
    """The weight an RMSNorm multiplies by: weight, 1 + weight (plus_one), or 1."""
    if not layer.elementwise_affine:
        return 1.0
    weight = params[id(layer)]["weight"]
    return 1.0 + weight if layer.plus_one else weight


def activation(x, name):
    """The activation of a GatedActivation by its name."""
    if name == "silu":
        return x / (1 + np.exp(-x))
    if name == "relu":
        return np.maximum(x, 0)
    if name == "tanh":
        return np.tanh(x)
    return gelu(x, "tanh" if name == "gelu_tanh" else "none")


def activation_grad(x, name):
    if name == "silu":
        s = 1 / (1 + np.exp(-x))
        return s + x * s * (1 - s)
    if name == "relu":
        return (x > 0).astype(x.dtype)
    if name == "tanh":
        return 1 - np.tanh(x) ** 2
    return gelu_grad(x, "tanh" if name == "gelu_tanh" else "none")


def layer_forward(layer, x, params, dropout=None):
    """Forward of one layer; returns (output, cache for backward). `dropout(layer, shape)` gives a
    Dropout layer's multiplier (keep mask times 1 / (1 - p)) in training; None: eval mode."""
    if cnnref.is_cnn_layer(layer):
        return cnnref.layer_forward(layer, x, params)
    if isinstance(layer, gt.nn.Linear):
        w = params[id(layer)]["weight"]
        b = params[id(layer)].get("bias")
        y = x @ w.T + (b if b is not None else 0)
        return y, x
    if isinstance(layer, gt.nn.ReLU):
        return np.maximum(x, 0), x
    if isinstance(layer, gt.nn.Tanh):
        return np.tanh(x), x
    if isinstance(layer, gt.nn.SiLU):
        return x / (1 + np.exp(-x)), x
    if isinstance(layer, gt.nn.GELU):
        return gelu(x, layer.approximate), x
    if isinstance(layer, gt.nn.Dropout):
        if dropout is None:
            return x, None  # eval mode
        multiplier = dropout(layer, x.shape)
        return x * multiplier, multiplier
    if isinstance(layer, gt.nn.Embedding):
        ids = np.asarray(x, dtype=np.int64)
        return params[id(layer)]["weight"][ids], ids
    if isinstance(layer, gt.nn.Flatten):
        return x.reshape(x.shape[0], -1) if x.ndim >= 2 else x, x.shape
    if isinstance(layer, gt.nn.LayerNorm):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        rstd = 1 / np.sqrt(var + layer.eps)
        xhat = (x - mean) * rstd
        p = params[id(layer)]
        return xhat * p["weight"] + p.get("bias", 0), (xhat, rstd)
    if isinstance(layer, gt.nn.RMSNorm):  # each of the `groups` chunks of the last dim on its own
        shape = x.shape
        x = x.reshape(*shape[:-1], layer.groups, layer.normalized_shape)
        rstd = 1 / np.sqrt((x * x).mean(-1, keepdims=True) + layer.eps)
        weight = rms_weight(layer, params)
        return (x * rstd * weight).reshape(shape), (x * rstd, rstd)
    if isinstance(layer, gt.nn.GatedActivation):  # [gate | up] -> act(gate) * up
        gate, up = np.split(x, 2, axis=-1)
        return activation(gate, layer.activation) * up, (gate, up)
    if isinstance(layer, gt.nn.Scale):
        return x * layer.factor, None
    if isinstance(layer, gt.nn.Parallel):
        outs, caches = zip(*(layer_forward(child, x, params, dropout) for child in layer.branches))
        return np.concatenate(outs, -1), ([o.shape[-1] for o in outs], caches)
    if isinstance(layer, gt.nn.MultiheadAttention):
        return attention_forward(layer, x, params, dropout)
    if isinstance(layer, gt.nn.Conv2d):
        p = params[id(layer)]
        return cref.conv2d(x, p["weight"], p.get("bias"), layer.stride, layer.padding, layer.dilation,
                           layer.groups), x
    if isinstance(layer, gt.nn.Sequential):
        caches = []
        for child in layer.layers:
            x, cache = layer_forward(child, x, params, dropout)
            caches.append(cache)
        return x, caches
    if isinstance(layer, gt.nn.Residual):
        y, cache = layer_forward(layer.block, x, params, dropout)
        return x + y, cache
    raise TypeError(type(layer))


def layer_backward(layer, dy, cache, params, grads):
    """Backward of one layer; accumulates parameter gradients into `grads`; returns dx."""
    if cnnref.is_cnn_layer(layer):
        return cnnref.layer_backward(layer, dy, cache, params, grads)
    if isinstance(layer, gt.nn.Linear):
        x = cache
        w = params[id(layer)]["weight"]
        g = grads.setdefault(id(layer), {})
        g["weight"] = dy.reshape(-1, dy.shape[-1]).T @ x.reshape(-1, x.shape[-1])
        if layer.has_bias:
            g["bias"] = dy.reshape(-1, dy.shape[-1]).sum(0)
        return dy @ w
    if isinstance(layer, gt.nn.ReLU):
        return dy * (cache > 0)
    if isinstance(layer, gt.nn.Tanh):
        return dy * (1 - np.tanh(cache) ** 2)
    if isinstance(layer, gt.nn.SiLU):
        s = 1 / (1 + np.exp(-cache))
        return dy * (s + cache * s * (1 - s))
    if isinstance(layer, gt.nn.GELU):
        return dy * gelu_grad(cache, layer.approximate)
    if isinstance(layer, gt.nn.Dropout):
        return dy if cache is None else dy * cache
    if isinstance(layer, gt.nn.Embedding):
        table = np.zeros_like(params[id(layer)]["weight"])
        np.add.at(table, cache.reshape(-1), dy.reshape(-1, table.shape[1]))
        grads.setdefault(id(layer), {})["weight"] = table
        return None  # no gradient for integer ids
    if isinstance(layer, gt.nn.Flatten):
        return dy.reshape(cache)
    if isinstance(layer, gt.nn.LayerNorm):
        xhat, rstd = cache
        p = params[id(layer)]
        g = grads.setdefault(id(layer), {})
        g["weight"] = (dy * xhat).reshape(-1, xhat.shape[-1]).sum(0)
        if layer.has_bias:
            g["bias"] = dy.reshape(-1, dy.shape[-1]).sum(0)
        dxhat = dy * p["weight"]
        n = xhat.shape[-1]
        return rstd * (dxhat - dxhat.mean(-1, keepdims=True) - xhat * (dxhat * xhat).mean(-1, keepdims=True))
    if isinstance(layer, gt.nn.RMSNorm):  # din = rstd (g - xhat mean(g xhat)), g = dy * weight
        xhat, rstd = cache
        shape = dy.shape
        dy = dy.reshape(xhat.shape)
        g = dy * rms_weight(layer, params)
        if layer.elementwise_affine:
            grads.setdefault(id(layer), {})["weight"] = (dy * xhat).reshape(-1, xhat.shape[-1]).sum(0)
        return (rstd * (g - xhat * (g * xhat).mean(-1, keepdims=True))).reshape(shape)
    if isinstance(layer, gt.nn.GatedActivation):
        gate, up = cache
        return np.concatenate([dy * up * activation_grad(gate, layer.activation),
                               dy * activation(gate, layer.activation)], -1)
    if isinstance(layer, gt.nn.Scale):
        return dy * layer.factor
    if isinstance(layer, gt.nn.Parallel):  # the children's input gradients summed
        widths, caches = cache
        parts = np.split(dy, np.cumsum(widths)[:-1], axis=-1)
        dxs = [layer_backward(c, d, k, params, grads) for c, d, k in zip(layer.branches, parts, caches)]
        return None if dxs[0] is None else sum(dxs)
    if isinstance(layer, gt.nn.MultiheadAttention):
        return attention_backward(layer, dy, cache, params, grads)
    if isinstance(layer, gt.nn.Conv2d):
        dx, dweight, dbias = cref.conv2d_backward(dy, cache, params[id(layer)]["weight"], layer.stride,
                                                  layer.padding, layer.dilation, layer.groups)
        g = grads.setdefault(id(layer), {})
        g["weight"] = g.get("weight", 0) + dweight
        if layer.has_bias:
            g["bias"] = g.get("bias", 0) + dbias
        return dx
    if isinstance(layer, gt.nn.Sequential):
        for child, child_cache in zip(reversed(layer.layers), reversed(cache)):
            dy = layer_backward(child, dy, child_cache, params, grads)
        return dy
    if isinstance(layer, gt.nn.Residual):
        return dy + layer_backward(layer.block, dy, cache, params, grads)
    raise TypeError(type(layer))


def attention_forward(layer, x, params, dropout=None):
    """MultiheadAttention: fused projection, per-head attention (tests/_attention_reference.py),
    output projection. `dropout(layer, (B, H, T, T))` gives the probabilities' multipliers."""
    qkv, in_cache = layer_forward(layer.in_proj, x, params)
    batch, seq, width = qkv.shape
    embed, heads = width // 3, layer.num_heads
    q, k, v = (qkv[..., i * embed:(i + 1) * embed].reshape(batch, seq, heads, embed // heads)
               .transpose(0, 2, 1, 3) for i in range(3))
    mult = None if dropout is None or layer.dropout == 0 else dropout(layer, (batch, heads, seq, seq))
    o, _ = aref.attention(q, k, v, layer.causal, mult=mult)
    y, out_cache = layer_forward(layer.out_proj, o.transpose(0, 2, 1, 3).reshape(batch, seq, embed), params)
    return y, (in_cache, (q, k, v, mult), out_cache)


def attention_backward(layer, dy, cache, params, grads):
    in_cache, (q, k, v, mult), out_cache = cache
    batch, heads, seq, dim = q.shape
    do = layer_backward(layer.out_proj, dy, out_cache, params, grads)
    do = do.reshape(batch, seq, heads, dim).transpose(0, 2, 1, 3)
    parts = aref.attention_backward(do, q, k, v, layer.causal, mult=mult)
    dqkv = np.concatenate([g.transpose(0, 2, 1, 3).reshape(batch, seq, heads * dim) for g in parts], -1)
    return layer_backward(layer.in_proj, dqkv, in_cache, params, grads)


def params_of(model):
    """float64 copies of every parameter, keyed by the layer that owns it."""
    params = {}
    list(model.parameters())  # compiles the model if it was not yet
    for module in model.modules():
        for name in module._param_names:
            parameter = module._params.get(name)
            if parameter is not None:
                params.setdefault(id(module), {})[name] = parameter.data.astype(np.float64)
    return params


def cross_entropy(logits, targets, label_smoothing=0.0):
    """Mean loss and d(loss)/d(logits) in float64."""
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    n, classes = logits.shape
    onehot = np.eye(classes)[targets]
    target_dist = (1 - label_smoothing) * onehot + label_smoothing / classes
    loss = -(target_dist * logp).sum(-1).mean()
    return loss, (np.exp(logp) - target_dist) / n


def assert_gradients_match(model, expected, tolerance: float, allowance: float = 1e-6) -> int:
    """Every parameter's .grad against expected(module, name), the float64 reference: the error's
    norm within `tolerance` of the reference's norm plus `allowance`. Returns how many it checked."""
    checked = 0
    for module in model.modules():
        for name in module._param_names:
            parameter = module._params.get(name)
            if parameter is None:
                continue
            reference = expected(module, name)
            error = np.linalg.norm(parameter.grad - reference)
            assert error <= tolerance * np.linalg.norm(reference) + allowance, (
                f"{type(module).__name__}.{name}: gradient off by {error:.3g} "
                f"(reference norm {np.linalg.norm(reference):.3g})")
            checked += 1
    return checked

"""A float64 NumPy reference of BatchNorm2d and the 2-D pooling layers (forward, backward and the
running-statistics update), written from PyTorch's documented semantics, for the CNN tests."""

from __future__ import annotations

import numpy as np


def batchnorm_forward(x, weight, bias, eps, batch_stats, running_mean=None, running_var=None):
    """(out, cache) of BatchNorm2d on (N, C, H, W); statistics per channel over N, H, W."""
    if batch_stats:
        mean = x.mean(axis=(0, 2, 3))
        var = x.var(axis=(0, 2, 3))
    else:
        mean, var = np.asarray(running_mean, np.float64), np.asarray(running_var, np.float64)
    rstd = 1 / np.sqrt(var + eps)
    xhat = (x - mean[None, :, None, None]) * rstd[None, :, None, None]
    w = np.ones_like(mean) if weight is None else weight
    b = np.zeros_like(mean) if bias is None else bias
    return xhat * w[None, :, None, None] + b[None, :, None, None], (xhat, rstd, w, batch_stats)


def batchnorm_backward(dy, cache):
    """(dx, dweight, dbias)."""
    xhat, rstd, w, batch_stats = cache
    dweight = (dy * xhat).sum(axis=(0, 2, 3))
    dbias = dy.sum(axis=(0, 2, 3))
    g = dy * (w * rstd)[None, :, None, None]
    if not batch_stats:
        return g, dweight, dbias
    return (g - g.mean(axis=(0, 2, 3), keepdims=True)
            - xhat * (g * xhat).mean(axis=(0, 2, 3), keepdims=True)), dweight, dbias


def running_update(x, running_mean, running_var, count, momentum):
    """PyTorch's update of (running_mean, running_var, num_batches_tracked) by a training batch."""
    count += 1
    factor = 1.0 / count if momentum is None else momentum
    m = x.shape[0] * x.shape[2] * x.shape[3]
    mean = x.mean(axis=(0, 2, 3))
    unbiased = x.var(axis=(0, 2, 3)) * m / (m - 1)
    return ((1 - factor) * running_mean + factor * mean, (1 - factor) * running_var + factor * unbiased, count)


def pool_out_size(size, k, pad, stride, dil, ceil_mode):
    """PyTorch's pooling_output_shape."""
    span = size + 2 * pad - dil * (k - 1) - 1 + (stride - 1 if ceil_mode else 0)
    out = span // stride + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def _windows(size, outs, k, stride, pad, dil, kind, count_include_pad):
    """Per output position: (input positions inside the input, divisor)."""
    windows = []
    for o in range(outs):
        if kind == "adaptive_avg":
            lo, hi = (o * size) // outs, -((-(o + 1) * size) // outs)
            windows.append((list(range(lo, hi)), hi - lo))
            continue
        start = o * stride - pad
        positions = [start + i * dil for i in range(k) if 0 <= start + i * dil < size]
        if kind == "avg":
            end = min(start + k, size + pad)
            windows.append((positions, end - start if count_include_pad else len(positions)))
        else:
            windows.append((positions, 1))
    return windows


def pool_windows(shape, kind, kernel=(1, 1), stride=(1, 1), padding=(0, 0), dilation=(1, 1),
                 ceil_mode=False, count_include_pad=True, output_size=None):
    """(rows, cols): the windows of every output row and column."""
    _, _, h, w = shape
    if kind == "adaptive_avg":
        oh, ow = output_size
        return (_windows(h, oh, 0, 1, 0, 1, kind, True), _windows(w, ow, 0, 1, 0, 1, kind, True))
    oh = pool_out_size(h, kernel[0], padding[0], stride[0], dilation[0], ceil_mode)
    ow = pool_out_size(w, kernel[1], padding[1], stride[1], dilation[1], ceil_mode)
    return (_windows(h, oh, kernel[0], stride[0], padding[0], dilation[0], kind, count_include_pad),
            _windows(w, ow, kernel[1], stride[1], padding[1], dilation[1], kind, count_include_pad))


def pool_forward(x, kind, windows):
    """(out, argmax cache) of pooling x (N, C, H, W) over `windows` (pool_windows)."""
    rows, cols = windows
    n, c = x.shape[:2]
    out = np.zeros((n, c, len(rows), len(cols)))
    argmax = {}
    for i, (rs, rdiv) in enumerate(rows):
        for j, (cs, cdiv) in enumerate(cols):
            block = x[:, :, rs][:, :, :, cs].reshape(n, c, -1)
            if kind == "max":
                first = block.argmax(-1)  # NumPy's argmax is the first maximum
                out[:, :, i, j] = np.take_along_axis(block, first[..., None], -1)[..., 0]
                argmax[i, j] = (np.asarray(rs)[first // len(cs)], np.asarray(cs)[first % len(cs)])
            else:
                out[:, :, i, j] = block.sum(-1) / (rdiv * cdiv)
    return out, argmax


def pool_backward(dy, x_shape, kind, windows, argmax):
    rows, cols = windows
    n, c = x_shape[:2]
    dx = np.zeros(x_shape)
    nn_, cc = np.meshgrid(np.arange(n), np.arange(c), indexing="ij")
    for i, (rs, rdiv) in enumerate(rows):
        for j, (cs, cdiv) in enumerate(cols):
            if kind == "max":
                r, col = argmax[i, j]
                np.add.at(dx, (nn_, cc, r, col), dy[:, :, i, j])
            else:
                share = dy[:, :, i, j] / (rdiv * cdiv)
                for r in rs:
                    for col in cs:
                        dx[:, :, r, col] += share
    return dx


def layer_windows(layer, shape):
    """pool_windows for a gputrain pooling layer."""
    return pool_windows(shape, layer._kind, layer._kernel, layer._stride, layer._padding, layer._dilation,
                        layer.ceil_mode, layer.count_include_pad,
                        output_size=layer._kernel if layer._kind == "adaptive_avg" else None)


def is_cnn_layer(layer) -> bool:
    import gputrain as gt

    return isinstance(layer, (gt.nn.BatchNorm2d, gt.nn.MaxPool2d, gt.nn.AvgPool2d, gt.nn.AdaptiveAvgPool2d))


def layer_forward(layer, x, params):
    """Forward of a CNN layer inside tests/_mlp_reference.py's model walk (train/eval from the
    layer's mode; eval reads the model's current running statistics)."""
    import gputrain as gt

    if isinstance(layer, gt.nn.BatchNorm2d):
        p = params.get(id(layer), {})
        batch_stats = layer.training or not layer.track_running_stats
        running = (None, None) if batch_stats else (layer.running_mean.astype(np.float64),
                                                    layer.running_var.astype(np.float64))
        return batchnorm_forward(x, p.get("weight"), p.get("bias"), layer.eps, batch_stats, *running)
    windows = layer_windows(layer, x.shape)
    out, argmax = pool_forward(x, layer._kind, windows)
    return out, (x.shape, windows, argmax)


def layer_backward(layer, dy, cache, params, grads):
    import gputrain as gt

    if isinstance(layer, gt.nn.BatchNorm2d):
        dx, dweight, dbias = batchnorm_backward(dy, cache)
        if layer.affine:
            grads.setdefault(id(layer), {}).update(weight=dweight, bias=dbias)
        return dx
    shape, windows, argmax = cache
    return pool_backward(dy, shape, layer._kind, windows, argmax)


def finite_difference(f, x, eps=1e-6):
    """Central differences of the scalar f at every element of x (float64)."""
    grad = np.zeros_like(x)
    flat, gflat = x.reshape(-1), grad.reshape(-1)
    for i in range(flat.size):
        keep = flat[i]
        flat[i] = keep + eps
        up = f(x)
        flat[i] = keep - eps
        down = f(x)
        flat[i] = keep
        gflat[i] = (up - down) / (2 * eps)
    return grad


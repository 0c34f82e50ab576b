"""A float64 NumPy reference of 2-D convolution (PyTorch's conv2d, NCHW) and its gradients."""

from __future__ import annotations

import numpy as np


def _pair(value):
    return (value, value) if isinstance(value, int) else tuple(value)


def out_size(size: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def _patches(xp, groups, kernel, stride, dilation, out_hw):
    """(g, i, j, patch) for every group and kernel element: patch (N, C / groups, OH, OW) is the
    padded input seen by kernel element (i, j) at every output position."""
    cg = xp.shape[1] // groups
    (kh, kw), (sh, sw), (dh, dw), (oh, ow) = kernel, stride, dilation, out_hw
    for g in range(groups):
        for i in range(kh):
            for j in range(kw):
                rows = slice(i * dh, i * dh + sh * (oh - 1) + 1, sh)
                cols = slice(j * dw, j * dw + sw * (ow - 1) + 1, sw)
                yield g, i, j, (slice(g * cg, (g + 1) * cg), rows, cols)


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """out (N, O, OH, OW) of x (N, C, H, W) and weight (O, C / groups, KH, KW), in float64."""
    x, weight = np.asarray(x, np.float64), np.asarray(weight, np.float64)
    stride, padding, dilation = _pair(stride), _pair(padding), _pair(dilation)
    n, _, h, w = x.shape
    o, _, kh, kw = weight.shape
    oh = out_size(h, kh, stride[0], padding[0], dilation[0])
    ow = out_size(w, kw, stride[1], padding[1], dilation[1])
    xp = np.pad(x, ((0, 0), (0, 0), (padding[0],) * 2, (padding[1],) * 2))
    og = o // groups
    out = np.zeros((n, o, oh, ow))
    for g, i, j, (chans, rows, cols) in _patches(xp, groups, (kh, kw), stride, dilation, (oh, ow)):
        patch = xp[:, chans, rows, cols]
        out[:, g * og:(g + 1) * og] += np.einsum("ncyx,oc->noyx", patch, weight[g * og:(g + 1) * og, :, i, j])
    if bias is not None:
        out += np.asarray(bias, np.float64)[None, :, None, None]
    return out


def conv2d_backward(dout, x, weight, stride=1, padding=0, dilation=1, groups=1):
    """(dx, dweight, dbias) of conv2d given dout (N, O, OH, OW), in float64."""
    dout = np.asarray(dout, np.float64)
    x, weight = np.asarray(x, np.float64), np.asarray(weight, np.float64)
    stride, padding, dilation = _pair(stride), _pair(padding), _pair(dilation)
    _, _, h, w = x.shape
    o, _, kh, kw = weight.shape
    oh, ow = dout.shape[2:]
    xp = np.pad(x, ((0, 0), (0, 0), (padding[0],) * 2, (padding[1],) * 2))
    dxp, dweight = np.zeros_like(xp), np.zeros_like(weight)
    og = o // groups
    for g, i, j, (chans, rows, cols) in _patches(xp, groups, (kh, kw), stride, dilation, (oh, ow)):
        d = dout[:, g * og:(g + 1) * og]
        dweight[g * og:(g + 1) * og, :, i, j] = np.einsum("noyx,ncyx->oc", d, xp[:, chans, rows, cols])
        dxp[:, chans, rows, cols] += np.einsum("noyx,oc->ncyx", d, weight[g * og:(g + 1) * og, :, i, j])
    dx = dxp[:, :, padding[0]:padding[0] + h, padding[1]:padding[1] + w]
    return dx, dweight, dout.sum((0, 2, 3))

"""BatchNorm2d and the 2-D pooling layers against PyTorch itself (skipped when PyTorch is not
installed): the ops' forward and input gradient (max-pool ties included), and whole training runs
with gradient accumulation whose losses, parameters and running statistics match torch.nn's."""

from __future__ import annotations

import numpy as np
import pytest

import gputrain as gt
from gputrain import _C_testing
from gputrain.optim import SGD

torch = pytest.importorskip("torch")
F = torch.nn.functional
nn = gt.nn

POOLS = [  # (kind, kernel, stride, padding, dilation, ceil_mode, count_include_pad)
    ("max", (2, 2), (2, 2), (0, 0), (1, 1), False, True),
    ("max", (3, 3), (2, 2), (1, 1), (1, 1), True, True),
    ("max", (2, 3), (1, 2), (1, 0), (2, 1), True, True),
    ("avg", (3, 3), (2, 2), (1, 1), (1, 1), True, True),
    ("avg", (3, 2), (2, 1), (1, 1), (1, 1), True, False),
    ("avg", (2, 2), (2, 2), (0, 0), (1, 1), False, True),
]
ADAPTIVE = [(1, 1), (3, 2), (4, 4), (5, 3)]


def torch_pool(x, kind, kernel, stride, padding, dilation, ceil_mode, include_pad):
    if kind == "max":
        return F.max_pool2d(x, kernel, stride, padding, dilation, ceil_mode=ceil_mode)
    return F.avg_pool2d(x, kernel, stride, padding, ceil_mode=ceil_mode, count_include_pad=include_pad)


def ours_pool(x, dout, out_shape, kind, kernel, stride, padding, dilation, include_pad, saved):
    """Forward and input gradient; max pooling with its maxima saved by forward (saved) or
    recomputed by backward."""
    out = np.empty(out_shape, np.float32)
    argmax = np.full(out_shape, -1, np.int32) if saved else None
    _C_testing.op_pool2d(out, x, kind, kernel, stride, padding, dilation, include_pad, "f32", argmax=argmax)
    din = np.empty_like(x)
    _C_testing.op_pool2d(din, x, kind, kernel, stride, padding, dilation, include_pad, "f32", dout=dout, argmax=argmax)
    return out, din


def compare(x, config, exact):
    for saved in (False, True) if config[0] == "max" else (False,):
        compare_once(x, config, exact, saved)


def compare_once(x, config, exact, saved):
    kind, kernel, stride, padding, dilation, ceil_mode, include_pad = config
    tx = torch.from_numpy(x.copy()).requires_grad_()
    ty = torch_pool(tx, *config) if kind != "adaptive_avg" else F.adaptive_avg_pool2d(tx, kernel)
    dout = np.random.default_rng(1).standard_normal(tuple(ty.shape)).astype(np.float32)
    ty.backward(torch.from_numpy(dout))
    out, din = ours_pool(x, dout, tuple(ty.shape), kind, kernel, stride, padding, dilation, include_pad, saved)
    if exact:
        np.testing.assert_array_equal(out, ty.detach().numpy())
        np.testing.assert_array_equal(din, tx.grad.numpy())
    else:
        np.testing.assert_allclose(out, ty.detach().numpy(), rtol=2e-6, atol=1e-6)
        np.testing.assert_allclose(din, tx.grad.numpy(), rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("config", POOLS + [("adaptive_avg", s, (1, 1), (0, 0), (1, 1), False, True) for s in ADAPTIVE])
@pytest.mark.parametrize("shape", [(3, 2, 7, 5), (1, 1, 9, 11), (2, 3, 8, 8)])
def test_pool_forward_and_input_gradient_match_torch(shape, config):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    compare(x, config, exact=config[0] == "max")


@pytest.mark.parametrize("config", [c for c in POOLS if c[0] == "max"])
def test_max_pool_ties_go_to_the_first_maximum_as_in_torch(config):
    x = np.random.default_rng(0).integers(0, 3, (2, 3, 9, 8)).astype(np.float32)  # many ties
    x[0, 0, :4, :4] = np.nan  # NaN counts as a maximum
    x[1, 1] = -np.inf
    compare(x, config, exact=True)


@pytest.mark.parametrize("batch_stats", [True, False])
def test_batchnorm_op_matches_torch(batch_stats):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((4, 3, 5, 7)) * 2 + 1).astype(np.float32)
    w, b = rng.standard_normal(3).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    rm, rv = rng.standard_normal(3).astype(np.float32), rng.random(3).astype(np.float32) + 0.5
    trm, trv = torch.from_numpy(rm.copy()), torch.from_numpy(rv.copy())
    tx, tw, tb = (torch.from_numpy(a.copy()).requires_grad_() for a in (x, w, b))
    ty = F.batch_norm(tx, trm, trv, tw, tb, training=batch_stats, momentum=0.1, eps=1e-5)
    dout = rng.standard_normal(x.shape).astype(np.float32)
    ty.backward(torch.from_numpy(dout))
    out, mean, rstd, count = np.empty_like(x), np.empty(3, np.float32), np.empty(3, np.float32), np.zeros(1, np.int64)
    _C_testing.op_batchnorm2d(out, mean, rstd, x, w, b, rm, rv, count, 1e-5, 0.1, batch_stats, batch_stats, "f32")
    din, dw, db = np.empty_like(x), np.empty(3, np.float32), np.empty(3, np.float32)
    _C_testing.op_batchnorm2d_backward(din, dw, db, dout, x, w, mean, rstd, batch_stats, "f32")
    np.testing.assert_allclose(out, ty.detach().numpy(), rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(rm, trm.numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(rv, trv.numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(din, tx.grad.numpy(), rtol=1e-4, atol=2e-6)
    np.testing.assert_allclose(dw, tw.grad.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(db, tb.grad.numpy(), rtol=1e-5, atol=1e-5)


def models(momentum):
    """The same CNN in gputrain and in torch, with gputrain's initial weights."""
    gt.random.manual_seed(0)
    ours = nn.Sequential(
        nn.Linear(6, 6), nn.BatchNorm2d(3, momentum=momentum), nn.ReLU(), nn.MaxPool2d(3, stride=2, padding=1),
        nn.BatchNorm2d(3, affine=False, momentum=momentum), nn.AvgPool2d(2, ceil_mode=True, count_include_pad=False),
        nn.AdaptiveAvgPool2d((2, 1)), nn.Flatten(), nn.Linear(6, 4))
    t = torch.nn
    theirs = t.Sequential(
        t.Linear(6, 6), t.BatchNorm2d(3, momentum=momentum), t.ReLU(), t.MaxPool2d(3, stride=2, padding=1),
        t.BatchNorm2d(3, affine=False, momentum=momentum), t.AvgPool2d(2, ceil_mode=True, count_include_pad=False),
        t.AdaptiveAvgPool2d((2, 1)), t.Flatten(), t.Linear(6, 4))
    theirs.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in ours.state_dict().items()})
    return ours, theirs


@pytest.mark.parametrize("momentum", [0.1, None])
def test_training_with_accumulation_matches_torch(momentum):
    ours, theirs = models(momentum)
    step = gt.TrainStep(ours, nn.CrossEntropyLoss(), SGD(ours.parameters(), lr=0.1), micro_batches=2)
    topt = torch.optim.SGD(theirs.parameters(), lr=0.1)
    rng = np.random.default_rng(3)
    for _ in range(4):
        x = (rng.standard_normal((6, 3, 7, 6)) * 2).astype(np.float32)
        y = rng.integers(0, 4, 6)
        loss = step(x, y).loss
        topt.zero_grad()
        total = 0.0
        for part in (slice(0, 3), slice(3, 6)):
            tl = F.cross_entropy(theirs(torch.from_numpy(x[part])), torch.from_numpy(y[part])) / 2
            tl.backward()
            total += tl.item()
        topt.step()
        assert loss == pytest.approx(total, rel=1e-5)
    theirs_state = theirs.state_dict()
    for key, value in ours.state_dict().items():
        np.testing.assert_allclose(value, theirs_state[key].numpy(), rtol=1e-4, atol=1e-5, err_msg=key)
    ours.eval(), theirs.eval()
    x = rng.standard_normal((2, 3, 7, 6)).astype(np.float32)
    np.testing.assert_allclose(ours(x), theirs(torch.from_numpy(x)).detach().numpy(), rtol=1e-4, atol=1e-5)

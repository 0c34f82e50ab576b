"""The fused optimizers against PyTorch itself (skipped when PyTorch is not installed):
100 steps of torch.optim.AdamW / SGD (foreach=False, CPU) on the same data, compared in ulps,
state_dict interchange, LambdaLR semantics and clip_grad_norm_."""

from __future__ import annotations

import numpy as np
import pytest

from gputrain.nn import Parameter
from gputrain.optim import SGD, AdamW, clip_grad_norm_, get_scheduler

from _optim_reference import ulp_diff

torch = pytest.importorskip("torch")

# odd sizes (vector tails) and one above torch's parallel grain (32768) so its threads split it
SHAPES = [(5,), (33, 17), (40_003,), (64, 64)]


def _pair(seed: int):
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    ours = [Parameter(a.copy()) for a in arrays]
    theirs = [torch.nn.Parameter(torch.from_numpy(a.copy())) for a in arrays]
    return ours, theirs


def _train(ours, theirs, opt, topt, steps: int, seed: int) -> tuple[int, float]:
    """Steps both; returns the largest difference in ulps and in ulps of the largest |p|."""
    rng = np.random.default_rng(seed)
    worst, worst_scaled = 0, 0.0
    for _ in range(steps):
        for p, t in zip(ours, theirs):
            g = (rng.standard_normal(p.shape) * 10.0 ** rng.integers(-3, 2)).astype(np.float32)
            p.grad = g
            t.grad = torch.from_numpy(g.copy())
        opt.step()
        topt.step()
        for p, t in zip(ours, theirs):
            a, b = p.data, t.detach().numpy()
            worst = max(worst, ulp_diff(a, b))
            scale = np.spacing(np.maximum(np.abs(a), np.abs(b)).max())
            worst_scaled = max(worst_scaled, float(np.max(np.abs(a.astype(np.float64) - b)) / scale))
    return worst, worst_scaled


@pytest.fixture
def correctly_rounded_sqrt(monkeypatch):
    """PyTorch's CPU Tensor.sqrt goes through MKL's vsSqrt (within 1 ulp, not always correctly
    rounded); NumPy's float32 sqrt is IEEE's, as ours."""
    monkeypatch.setattr(torch.Tensor, "sqrt", lambda self: torch.from_numpy(np.sqrt(self.detach().numpy())))


ADAMW_OPTIONS = [
    {},
    {"lr": 1e-2, "weight_decay": 0.1, "betas": (0.8, 0.95), "eps": 1e-6},
    {"lr": 1e-2, "amsgrad": True},
    {"lr": 1e-3, "maximize": True},
]


@pytest.mark.slow
@pytest.mark.parametrize("options", ADAMW_OPTIONS)
def test_adamw_100_steps_bit_identical_to_pytorch_arithmetic(options, correctly_rounded_sqrt):
    ours, theirs = _pair(1)
    worst, _ = _train(ours, theirs, AdamW(ours, **options), torch.optim.AdamW(theirs, foreach=False, **options),
                      steps=100, seed=2)
    assert worst == 0


@pytest.mark.slow
@pytest.mark.parametrize("options", ADAMW_OPTIONS)
def test_adamw_100_steps_against_stock_pytorch(options, capsys):
    """With PyTorch's own sqrt the trajectories differ by the last bit of some square roots."""
    ours, theirs = _pair(1)
    worst, scaled = _train(ours, theirs, AdamW(ours, **options),
                           torch.optim.AdamW(theirs, foreach=False, **options), steps=100, seed=2)
    with capsys.disabled():
        print(f"\nAdamW {options} vs torch.optim.AdamW(foreach=False), 100 steps: largest difference "
              f"{worst} ulp, {scaled:.2f} ulp of max|p|")
    assert scaled <= 4.0


@pytest.mark.slow
@pytest.mark.parametrize("options", [
    {"lr": 0.01},
    {"lr": 0.01, "momentum": 0.9, "weight_decay": 1e-3},
    {"lr": 0.01, "momentum": 0.9, "dampening": 0.2},
    {"lr": 0.01, "momentum": 0.9, "nesterov": True, "maximize": True},
])
def test_sgd_100_steps_bit_identical_to_pytorch(options):
    ours, theirs = _pair(3)
    worst, _ = _train(ours, theirs, SGD(ours, **options), torch.optim.SGD(theirs, foreach=False, **options),
                      steps=100, seed=4)
    assert worst == 0


def test_state_dicts_interchange_with_pytorch(correctly_rounded_sqrt):
    ours, theirs = _pair(5)
    opt, topt = AdamW(ours, lr=1e-2), torch.optim.AdamW(theirs, lr=1e-2, foreach=False)
    _train(ours, theirs, opt, topt, steps=3, seed=6)
    # PyTorch's state into ours (tensors are taken through np.asarray), then both continue
    fresh_ours = [Parameter(t.detach().numpy().copy()) for t in theirs]
    fresh = AdamW(fresh_ours, lr=1e-2)
    fresh.load_state_dict(topt.state_dict())
    assert _train(fresh_ours, theirs, fresh, topt, steps=3, seed=7)[0] == 0
    # ours into PyTorch
    sd = fresh.state_dict()
    loaded = {"state": {k: {n: torch.as_tensor(v) for n, v in s.items()} for k, s in sd["state"].items()},
              "param_groups": [dict(g) for g in sd["param_groups"]]}
    fresh_theirs = [torch.nn.Parameter(torch.from_numpy(p.data.copy())) for p in fresh_ours]
    topt2 = torch.optim.AdamW(fresh_theirs, lr=1e-2, foreach=False)
    topt2.load_state_dict(loaded)
    assert _train(fresh_ours, fresh_theirs, fresh, topt2, steps=3, seed=8)[0] == 0


def test_lambda_lr_semantics_match_pytorch():
    ours, theirs = _pair(9)
    opt, topt = AdamW(ours, lr=0.1), torch.optim.AdamW(theirs, lr=0.1)
    sched = get_scheduler("linear", opt, num_warmup_steps=3, num_training_steps=10)
    tsched = torch.optim.lr_scheduler.LambdaLR(topt, sched.lr_lambdas[0])
    for _ in range(12):
        assert opt.param_groups[0]["lr"] == topt.param_groups[0]["lr"]
        assert sched.get_last_lr() == tsched.get_last_lr()
        topt.step()
        sched.step()
        tsched.step()


def test_clip_grad_norm_matches_pytorch():
    ours, theirs = _pair(10)
    rng = np.random.default_rng(11)
    for p, t in zip(ours, theirs):
        g = rng.standard_normal(p.shape).astype(np.float32)
        p.grad = g
        t.grad = torch.from_numpy(g.copy())
    norm = clip_grad_norm_(ours, 1.0)
    tnorm = torch.nn.utils.clip_grad_norm_(theirs, 1.0, foreach=False)
    assert norm == pytest.approx(float(tnorm), rel=1e-6)
    for p, t in zip(ours, theirs):
        np.testing.assert_allclose(p.grad, t.grad.numpy(), rtol=1e-6)

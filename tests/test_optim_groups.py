"""Parameter-group helpers (no weight decay on biases/norm weights, layer-wise lr decay), groups
added later, and clipping (PyTorch's clip_grad_norm_ semantics, fused and standalone)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import gputrain as gt
from gputrain.nn import Parameter
from gputrain.optim import (
    SGD,
    AdamW,
    clip_coefficient,
    clip_grad_norm_,
    param_groups_llrd,
    param_groups_weight_decay,
    total_norm,
)

from _optim_reference import AdamWReference, ulp_diff


def _layer(i: int, fan_in: int = 4, fan_out: int = 3) -> list[tuple[str, Parameter]]:
    rng = np.random.default_rng(i)
    return [(f"{i}.weight", Parameter(rng.standard_normal((fan_out, fan_in)).astype(np.float32))),
            (f"{i}.bias", Parameter(np.zeros(fan_out, np.float32))),
            (f"{i}.norm.weight", Parameter(np.ones(fan_out, np.float32)))]


def test_weight_decay_groups_exclude_biases_and_norm_weights():
    named = _layer(0) + _layer(1)
    groups = param_groups_weight_decay(named, weight_decay=0.05, lr=0.1)
    assert [len(g["params"]) for g in groups] == [2, 4]
    assert groups[0]["weight_decay"] == 0.05 and groups[1]["weight_decay"] == 0.0
    assert all(g["lr"] == 0.1 for g in groups)
    assert all(p.data.ndim == 2 for p in groups[0]["params"])
    skip = param_groups_weight_decay(named, skip_list=["1.weight"])
    assert len(skip[0]["params"]) == 1


def test_weight_decay_groups_train_as_their_hyperparameters_say():
    named = _layer(2)
    groups = param_groups_weight_decay(named, weight_decay=0.5)
    opt = AdamW(groups, lr=1e-2)
    refs = {id(p): (AdamWReference(lr=1e-2, weight_decay=0.5 if p.data.ndim == 2 else 0.0), p.data.copy())
            for _, p in named}
    rng = np.random.default_rng(3)
    for _ in range(3):
        for _, p in named:
            g = rng.standard_normal(p.shape).astype(np.float32)
            p.grad = g
            ref, data = refs[id(p)]
            ref.update(0, data, g)
        opt.step()
    for _, p in named:
        assert ulp_diff(p.data, refs[id(p)][1]) == 0


def test_layer_wise_lr_decay():
    layers = [_layer(i) for i in range(3)]
    groups = param_groups_llrd(layers, lr=1.0, llrd=0.5, weight_decay=0.01)
    by_layer = {}
    for g in groups:
        by_layer.setdefault(g["layer_id"], []).append(g)
    assert sorted(by_layer) == [0, 1, 2]
    assert [by_layer[i][0]["lr"] for i in range(3)] == [0.25, 0.5, 1.0]
    assert [by_layer[i][0]["lr_scale"] for i in range(3)] == [0.25, 0.5, 1.0]
    assert all(len(v) == 2 for v in by_layer.values())
    opt = SGD(groups, lr=1.0)
    assert len(opt.param_groups) == 6
    with pytest.raises(ValueError, match="llrd"):
        param_groups_llrd(layers, lr=1.0, llrd=1.5)
    with pytest.raises(ValueError, match="no layer has parameters"):
        param_groups_llrd([[], []], lr=1.0)


def test_add_param_group_keeps_existing_state():
    a, b = Parameter(np.ones(5, np.float32)), Parameter(np.ones(7, np.float32))
    opt = AdamW([a], lr=1e-2)
    a.grad = np.ones(5, np.float32)
    opt.step()
    before = opt.state_dict()["state"][0]
    opt.add_param_group({"params": [b], "lr": 1e-3})
    after = opt.state_dict()
    np.testing.assert_array_equal(after["state"][0]["exp_avg"], before["exp_avg"])
    assert after["param_groups"][1]["lr"] == 1e-3 and after["param_groups"][1]["params"] == [1]
    with pytest.raises(ValueError, match="more than one parameter group"):
        opt.add_param_group({"params": [a]})


def _grads(seed: int, shapes) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def test_clip_grad_norm_semantics():
    shapes = [(10,), (3, 7)]
    params = [Parameter(np.zeros(s, np.float32)) for s in shapes]
    grads = _grads(4, shapes)
    for p, g in zip(params, grads):
        p.grad = g.copy()
    expected = math.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads))
    norm = clip_grad_norm_(params, 1.0)
    assert norm == pytest.approx(expected, rel=1e-12)
    coef = np.float32(1.0 / (expected + 1e-6))
    for p, g in zip(params, grads):
        np.testing.assert_array_equal(p.grad, g * coef)
    assert clip_grad_norm_(params, 1e9) == pytest.approx(1.0, rel=1e-5)  # coefficient clamped to 1
    assert clip_coefficient(2.0, 1.0) == 1.0
    assert total_norm(grads, math.inf) == max(float(np.max(np.abs(g))) for g in grads)
    assert total_norm(grads, 1.0) == pytest.approx(sum(float(np.sum(np.abs(g))) for g in grads))
    with pytest.raises(ValueError, match="norm_type"):
        total_norm(grads, -1.0)


def test_fused_clipping_equals_rewriting_the_gradients():
    shapes = [(33,), (8, 9)]
    fused_params = [Parameter(np.ones(s, np.float32)) for s in shapes]
    plain_params = [Parameter(np.ones(s, np.float32)) for s in shapes]
    fused, plain = AdamW(fused_params, lr=1e-2), AdamW(plain_params, lr=1e-2)
    for seed in range(5):
        grads = _grads(seed, shapes)
        for pf, pp, g in zip(fused_params, plain_params, grads):
            pf.grad, pp.grad = g.copy(), g.copy()
        norm_fused = fused.clip_grad_norm_(0.5)
        norm_plain = clip_grad_norm_(plain_params, 0.5)
        assert norm_fused == norm_plain
        fused.step()
        plain.step()
        for pf, pp in zip(fused_params, plain_params):
            assert ulp_diff(pf.data, pp.data) == 0


def test_non_finite_norm():
    p = Parameter(np.ones(3, np.float32))
    opt = AdamW([p])
    p.grad = np.array([1.0, np.inf, 0.0], np.float32)
    with pytest.raises(RuntimeError, match="non-finite"):
        opt.clip_grad_norm_(1.0, error_if_nonfinite=True)
    with pytest.raises(RuntimeError, match="non-finite"):
        clip_grad_norm_([p], 1.0, error_if_nonfinite=True)
    assert math.isinf(opt.clip_grad_norm_(1.0, skip_if_nonfinite=True))
    opt.step()
    assert opt.last_step_skipped and opt.step_count == 0
    np.testing.assert_array_equal(p.data, 1.0)
    p.grad = np.ones(3, np.float32)
    opt.step()
    assert not opt.last_step_skipped and opt.step_count == 1
    opt.clip_grad_norm_(1.0)
    opt.zero_grad()  # forgets a coefficient that was never used
    assert opt._pending_coef == 1.0


def test_rejected_add_param_group_leaves_the_optimizer_as_it_was():
    # found by tests/fuzz: the C core refused SGD's bad 'betas' after the group was appended, so
    # param_groups had a group the core lacked and state_dict() raised IndexError from then on
    model = gt.nn.Sequential(gt.nn.Linear(4, 3))
    opt = gt.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    gt.TrainStep(model, gt.nn.CrossEntropyLoss(), opt)(np.ones((2, 4), np.float32), np.array([0, 1]))
    before = opt.state_dict()
    extra = gt.nn.Parameter(np.zeros(3, np.float32))
    with pytest.raises(TypeError, match="betas"):
        opt.add_param_group({"params": [extra], "betas": 0})
    after = opt.state_dict()
    assert len(opt.param_groups) == 1 and after["param_groups"] == before["param_groups"]
    assert all(np.array_equal(after["state"][0][k], before["state"][0][k]) for k in before["state"][0])

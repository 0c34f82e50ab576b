"""Fused AdamW and SGD against NumPy references of PyTorch's CPU arithmetic (bit for bit), at
every SIMD level and thread count; skipping, merging, state_dict, validation, bad arguments."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import gputrain
from gputrain import _C
from gputrain.nn import Parameter
from gputrain.optim import SGD, AdamW

from _optim_reference import AdamWReference, SGDReference, ulp_diff

SHAPES = [(7,), (33, 5), (1,), (16,), (3, 129)]  # odd sizes exercise every vector tail
LEVELS = ["scalar", "avx2", "avx512"]


def _supported_levels() -> list[str]:
    best = _C.build_info()["simd_supported"]
    return LEVELS[: LEVELS.index(best) + 1]


@pytest.fixture(params=_supported_levels())
def simd_level(request):
    best = _C.build_info()["simd_supported"]
    _C.set_simd_level(request.param)
    yield request.param
    _C.set_simd_level(best)


def _params(seed: int, shapes=SHAPES) -> list[Parameter]:
    rng = np.random.default_rng(seed)
    return [Parameter(rng.standard_normal(s).astype(np.float32), name=f"p{i}") for i, s in enumerate(shapes)]


def _grads(rng: np.random.Generator, params) -> list[np.ndarray]:
    return [(rng.standard_normal(p.shape) * 10.0 ** rng.integers(-4, 2)).astype(np.float32) for p in params]


def _run(opt, params, reference, steps: int, seed: int, grad_coef: float = 1.0):
    refs = [p.data.copy() for p in params]
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        grads = _grads(rng, params)
        for i, (p, g) in enumerate(zip(params, grads)):
            p.grad = g
            reference.update(i, refs[i], g, grad_coef)
        if grad_coef != 1.0:
            opt._pending_coef = grad_coef
        opt.step()
    return refs


@pytest.mark.parametrize("options", [
    {},
    {"lr": 3e-2, "weight_decay": 0.1, "betas": (0.8, 0.95), "eps": 1e-6},
    {"amsgrad": True, "lr": 1e-2},
    {"maximize": True, "weight_decay": 0.0},
    {"betas": (0.3, 0.5)},  # lerp weight >= 0.5 takes the other FMA form
])
def test_adamw_matches_pytorch_arithmetic(simd_level, options):
    params = _params(1)
    opt = AdamW(params, **options)
    refs = _run(opt, params, AdamWReference(**options), steps=12, seed=2)
    for p, r in zip(params, refs):
        assert ulp_diff(p.data, r) == 0


@pytest.mark.parametrize("options", [
    {"lr": 0.1},
    {"lr": 0.1, "momentum": 0.9},
    {"lr": 0.05, "momentum": 0.9, "dampening": 0.3, "weight_decay": 1e-2},
    {"lr": 0.05, "momentum": 0.8, "nesterov": True, "weight_decay": 1e-3},
    {"lr": 0.05, "momentum": 0.5, "maximize": True},
])
def test_sgd_matches_pytorch_arithmetic(simd_level, options):
    params = _params(3)
    opt = SGD(params, **options)
    refs = _run(opt, params, SGDReference(**options), steps=8, seed=4)
    for p, r in zip(params, refs):
        assert ulp_diff(p.data, r) == 0


def test_grad_coef_is_applied_as_gradients_are_read(simd_level):
    params = _params(5)
    opt = AdamW(params, lr=1e-2)
    refs = _run(opt, params, AdamWReference(lr=1e-2), steps=5, seed=6, grad_coef=0.37)
    for p, r in zip(params, refs):
        assert ulp_diff(p.data, r) == 0


@pytest.mark.parametrize("numerics", ["exact", "fast"])
def test_every_simd_level_and_thread_count_gives_the_same_bits(numerics):
    best = _C.build_info()["simd_supported"]
    threads = gputrain.get_num_threads()
    results = []
    try:
        for level in _supported_levels():
            for num_threads in (1, 2):
                _C.set_simd_level(level)
                gputrain.set_num_threads(num_threads)
                params = _params(7, [(70001,), (5,), (300, 300)])
                opt = AdamW(params, lr=1e-2, numerics=numerics)
                _run(opt, params, AdamWReference(lr=1e-2), steps=3, seed=8)
                results.append(np.concatenate([p.data.ravel() for p in params]))
    finally:
        _C.set_simd_level(best)
        gputrain.set_num_threads(threads)
    for r in results[1:]:
        assert ulp_diff(r, results[0]) == 0


def test_fast_numerics_stay_within_a_few_ulps_of_exact():
    """One step from the same parameters and state: |fast - exact| <= 4 ulps of the parameter's
    magnitude max(|p before|, |p after|) (the update itself is within a few ulps)."""
    rng = np.random.default_rng(9)
    shapes = [(40_001,), (64, 33)]
    exact_params, fast_params = _params(10, shapes), _params(10, shapes)
    exact = AdamW(exact_params, lr=1e-3, numerics="exact")
    fast = AdamW(fast_params, lr=1e-3, numerics="fast")
    worst, differing = 0.0, 0
    for _ in range(30):
        grads = _grads(rng, exact_params)
        before = [p.data.copy() for p in exact_params]
        for pe, pf, g in zip(exact_params, fast_params, grads):
            pe.grad, pf.grad = g, g
            pf.data[...] = pe.data
        fast.load_state_dict(exact.state_dict())
        exact.step()
        fast.step()
        for pe, pf, b in zip(exact_params, fast_params, before):
            scale = np.maximum(np.abs(b), np.abs(pe.data))
            error = np.abs(pe.data.astype(np.float64) - pf.data) / np.spacing(scale)
            worst = max(worst, float(error.max()))
            differing += int(np.count_nonzero(pe.data != pf.data))
    assert worst <= 4.0
    assert differing > 0  # it is a different arithmetic


def test_parameters_without_gradient_are_skipped_and_keep_their_own_step():
    params = _params(11, [(10,), (20,)])
    opt = AdamW(params, lr=1e-2)
    ref = AdamWReference(lr=1e-2)
    refs = [p.data.copy() for p in params]
    rng = np.random.default_rng(12)
    for step in range(6):
        for i, p in enumerate(params):
            if i == 1 and step % 2 == 0:
                p.grad = None
                continue
            g = rng.standard_normal(p.shape).astype(np.float32)
            p.grad = g
            ref.update(i, refs[i], g)
        opt.step()
    assert ulp_diff(params[0].data, refs[0]) == 0
    assert ulp_diff(params[1].data, refs[1]) == 0
    state = opt.state_dict()["state"]
    assert float(state[0]["step"]) == 6 and float(state[1]["step"]) == 3


def test_adjacent_parameters_merge_into_one_run_with_the_same_result():
    rng = np.random.default_rng(13)
    flat = rng.standard_normal(1000).astype(np.float32)
    grads = rng.standard_normal((3, 1000)).astype(np.float32)
    arena = flat.copy()
    views = [Parameter(arena[0:300].reshape(30, 10)), Parameter(arena[300:1000])]
    separate = [Parameter(flat[0:300].reshape(30, 10).copy()), Parameter(flat[300:1000].copy())]
    opt_views, opt_separate = AdamW(views, lr=1e-2), AdamW(separate, lr=1e-2)
    for g in grads:
        for group in (views, separate):
            group[0].grad = g[:300].reshape(30, 10)
            group[1].grad = g[300:]
        opt_views.step()
        opt_separate.step()
    assert ulp_diff(arena, np.concatenate([p.data.ravel() for p in separate])) == 0


def test_fused_step_does_not_rewrite_gradients():
    params = _params(14)
    opt = AdamW(params)
    grads = [np.ones(p.shape, np.float32) for p in params]
    copies = [g.copy() for g in grads]
    for p, g in zip(params, grads):
        p.grad = g
    opt.clip_grad_norm_(0.1)
    opt.step()
    for p, c in zip(params, copies):
        np.testing.assert_array_equal(p.grad, c)


def test_zero_grad():
    params = _params(15)
    opt = SGD(params, lr=0.1)
    for p in params:
        p.grad = np.ones(p.shape, np.float32)
    opt.zero_grad(set_to_none=False)
    assert all(np.all(p.grad == 0) for p in params)
    opt.zero_grad()
    assert all(p.grad is None for p in params)
    before = [p.data.copy() for p in params]
    opt.step()  # nothing has a gradient: nothing moves
    assert all(np.array_equal(p.data, b) for p, b in zip(params, before))
    assert opt.step_count == 0


def test_per_group_hyperparameters_and_lr_changes_between_steps():
    params = _params(16, [(50,), (60,)])
    opt = AdamW([{"params": [params[0]], "lr": 1e-2, "weight_decay": 0.0}, {"params": [params[1]]}], lr=1e-3)
    refs = [AdamWReference(lr=1e-2, weight_decay=0.0), AdamWReference(lr=1e-3)]
    data = [p.data.copy() for p in params]
    rng = np.random.default_rng(17)
    for step in range(4):
        opt.param_groups[1]["lr"] = 1e-3 * (step + 1)
        refs[1].lr = 1e-3 * (step + 1)
        for i, p in enumerate(params):
            g = rng.standard_normal(p.shape).astype(np.float32)
            p.grad = g
            refs[i].update(0, data[i], g)
        opt.step()
    for p, d in zip(params, data):
        assert ulp_diff(p.data, d) == 0


@pytest.mark.parametrize("make", [
    lambda ps: AdamW(ps, lr=1e-2, amsgrad=True),
    lambda ps: SGD(ps, lr=1e-2, momentum=0.9, nesterov=True),
])
def test_state_dict_round_trip_continues_identically(make):
    rng = np.random.default_rng(18)
    params_a, params_b = _params(19), _params(19)
    opt_a, opt_b = make(params_a), make(params_b)
    grads = [_grads(rng, params_a) for _ in range(6)]
    for g in grads[:3]:
        for p, gi in zip(params_a, g):
            p.grad = gi
        opt_a.step()
    for pa, pb in zip(params_a, params_b):
        pb.data[...] = pa.data
    saved = opt_a.state_dict()
    opt_b.load_state_dict(saved)
    for g in grads[3:]:
        for pa, pb, gi in zip(params_a, params_b, g):
            pa.grad, pb.grad = gi, gi.copy()
        opt_a.step()
        opt_b.step()
    for pa, pb in zip(params_a, params_b):
        assert ulp_diff(pa.data, pb.data) == 0


def test_state_dict_layout_is_pytorchs():
    params = _params(20, [(3, 4), (5,)])
    opt = AdamW(params)
    for p in params:
        p.grad = np.ones(p.shape, np.float32)
    opt.step()
    sd = opt.state_dict()
    assert sorted(sd) == ["param_groups", "state"]
    assert sorted(sd["state"][0]) == ["exp_avg", "exp_avg_sq", "step"]
    assert sd["state"][0]["exp_avg"].shape == (3, 4)
    assert sd["state"][0]["step"].dtype == np.float32 and float(sd["state"][0]["step"]) == 1.0
    assert sd["param_groups"][0]["params"] == [0, 1]
    assert sd["param_groups"][0]["betas"] == (0.9, 0.999)
    np.testing.assert_allclose(sd["state"][1]["exp_avg"], 0.1, rtol=1e-6)
    assert set(opt.state) == set(params)


@pytest.mark.parametrize("make", [lambda ps: AdamW(ps), lambda ps: SGD(ps, momentum=0.9)])
def test_state_of_a_parameter_without_state_reads_empty_as_pytorch(make):
    # torch's optimizer.state is a defaultdict(dict): state[p] is {} before p's first step
    params = _params(23, [(3,), (4,)])
    opt = make(params)
    assert opt.state[params[0]] == {}
    params[1].grad = np.ones(4, np.float32)
    opt.step()
    state = opt.state
    assert state[params[0]] == {} and sorted(state[params[1]]) != []


def test_load_state_dict_rejects_mismatches():
    params = _params(21, [(3,), (4,)])
    opt = AdamW(params)
    sd = opt.state_dict()
    with pytest.raises(ValueError, match="different number of parameter groups"):
        opt.load_state_dict({"state": {}, "param_groups": sd["param_groups"] * 2})
    bad = {"state": {0: {"step": 1.0, "exp_avg": np.zeros(5), "exp_avg_sq": np.zeros(3)}},
           "param_groups": sd["param_groups"]}
    with pytest.raises(ValueError, match=r"expected shape \(3,\), got \(5,\)"):
        opt.load_state_dict(bad)
    group = dict(sd["param_groups"][0], params=[0])
    with pytest.raises(ValueError, match="doesn't match the size"):
        opt.load_state_dict({"state": {}, "param_groups": [group]})


@pytest.mark.parametrize("kwargs, message", [
    ({"lr": -1.0}, "Invalid learning rate: -1.0"),
    ({"eps": 0.0}, "Invalid epsilon value: 0.0"),
    ({"eps": -1e-8}, "Invalid epsilon value"),
    ({"betas": (1.0, 0.999)}, "Invalid beta parameter at index 0: 1.0"),
    ({"betas": (0.9, -0.1)}, "Invalid beta parameter at index 1: -0.1"),
    ({"weight_decay": -0.1}, "Invalid weight_decay value: -0.1"),
    ({"cpu_offload_fraction": 1.5}, "cpu_offload_fraction"),
    ({"cpu_offload_fraction": -0.1}, "cpu_offload_fraction"),
    ({"numerics": "approximate"}, "numerics"),
])
def test_adamw_bad_hyperparameters(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        AdamW(_params(22), **kwargs)


@pytest.mark.parametrize("kwargs, message", [
    ({"lr": -0.5}, "Invalid learning rate: -0.5"),
    ({"momentum": -0.9}, "Invalid momentum value: -0.9"),
    ({"weight_decay": -1.0}, "Invalid weight_decay value: -1.0"),
    ({"nesterov": True}, "Nesterov momentum requires a momentum and zero dampening"),
    ({"nesterov": True, "momentum": 0.9, "dampening": 0.1}, "Nesterov momentum requires"),
])
def test_sgd_bad_hyperparameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SGD(_params(23), **kwargs)


def test_bad_params():
    p = _params(24)[0]
    with pytest.raises(ValueError, match="empty parameter list"):
        AdamW([])
    with pytest.raises(TypeError, match="iterable of Parameters"):
        AdamW(p)
    with pytest.raises(TypeError, match="can only optimize Parameters"):
        AdamW([np.zeros(3, np.float32)])
    with pytest.raises(TypeError, match="ordered collections"):
        AdamW({p})
    with pytest.raises(ValueError, match="more than one parameter group"):
        AdamW([{"params": [p]}, {"params": [p]}])
    with pytest.raises(TypeError, match="lr must be a real number"):
        AdamW([p], lr="0.1")
    opt = AdamW([p])
    opt.param_groups[0]["lr"] = -1.0
    p.grad = np.ones(p.shape, np.float32)
    with pytest.raises(ValueError, match="Invalid learning rate"):
        opt.step()


def test_core_rejects_bad_arrays_and_settings():
    good = np.zeros(4, np.float32)
    hp = [{"lr": 0.1}]
    with pytest.raises(TypeError, match="float32"):
        _C.Optimizer("adamw", [np.zeros(4)], [0], hp)
    with pytest.raises(ValueError, match="C-contiguous"):
        _C.Optimizer("adamw", [np.zeros((4, 4), np.float32)[:, 0]], [0], hp)
    with pytest.raises(ValueError, match="kind"):
        _C.Optimizer("adam", [good], [0], hp)
    with pytest.raises(IndexError, match="out of range"):
        _C.Optimizer("adamw", [good], [3], hp)
    with pytest.raises(ValueError, match="lr"):
        _C.Optimizer("adamw", [good], [0], [{"lr": float("nan")}])
    core = _C.Optimizer("sgd", [good], [0], [{"lr": 0.1}])
    with pytest.raises(ValueError, match="has 3 elements"):
        core.step([np.zeros(3, np.float32)])
    with pytest.raises(ValueError, match="one per parameter"):
        core.step([])
    with pytest.raises(ValueError, match="momentum: cannot be turned on"):
        core.set_hparams(0, {"lr": 0.1, "momentum": 0.9})
    with pytest.raises(IndexError):
        core.get_state(5)
    with pytest.raises(ValueError, match="not kept"):
        core.set_state(0, 1, {"exp_avg": good})


def test_no_reference_leaks_and_inputs_unchanged():
    params = _params(25)
    opt = AdamW(params)
    grads = [np.ones(p.shape, np.float32) for p in params]
    for p, g in zip(params, grads):
        p.grad = g
    opt.step()
    before = [sys.getrefcount(g) for g in grads]
    for _ in range(200):
        opt.step()
        opt.state_dict()
    after = [sys.getrefcount(g) for g in grads]
    assert before == after
    assert all(np.all(g == 1.0) for g in grads)


def test_grad_norm_is_deterministic_and_accurate():
    rng = np.random.default_rng(26)
    x = (rng.standard_normal(3_000_001) * 3).astype(np.float32)
    expected = float(np.sum(x.astype(np.float64) ** 2))
    best = _C.build_info()["simd_supported"]
    threads = gputrain.get_num_threads()
    values = set()
    try:
        for level in _supported_levels():
            for num_threads in (1, 2):
                _C.set_simd_level(level)
                gputrain.set_num_threads(num_threads)
                values.add(_C.grad_sumsq(x))
    finally:
        _C.set_simd_level(best)
        gputrain.set_num_threads(threads)
    assert len(values) == 1
    assert values.pop() == pytest.approx(expected, rel=1e-12)
    assert _C.grad_sumsq(np.zeros(0, np.float32)) == 0.0
    assert _C.grad_absmax(np.array([1, -7, 3], np.float32)) == 7.0
    assert np.isnan(_C.grad_absmax(np.array([1, np.nan], np.float32)))

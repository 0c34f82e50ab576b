"""gputrain.amp.GradScaler's Python API: PyTorch's workflow, errors, state and extras."""

from __future__ import annotations

import copy
import json
import pickle
import warnings

import numpy as np
import pytest

import gputrain
from gputrain.amp import GradScaler, OptState, ScaleUnderflowWarning
from gputrain.nn import Parameter


class FakeOptimizer:
    """The duck-typed optimizer interface GradScaler relies on (PyTorch's)."""

    def __init__(self, *groups: list[Parameter]) -> None:
        self.param_groups = [{"params": list(params), "lr": 0.1} for params in groups]
        self.steps = 0
        self.step_args: tuple = ()

    def step(self, *args, **kwargs) -> None:
        self.steps += 1
        self.step_args = (args, kwargs)


class FakeScheduler:
    """Counts epochs; advanced only when scaler.step() reports a real step."""

    def __init__(self) -> None:
        self.last_epoch = 0

    def step(self) -> None:
        self.last_epoch += 1


def make_params(grads: list[np.ndarray | None]) -> list[Parameter]:
    params = []
    for i, grad in enumerate(grads):
        p = Parameter(np.zeros(3 if grad is None else grad.shape, np.float32), name=f"p{i}")
        p.grad = grad
        params.append(p)
    return params


def test_defaults_match_pytorch():
    scaler = GradScaler()
    assert scaler.get_scale() == 65536.0
    assert scaler.get_growth_factor() == 2.0 and scaler.get_backoff_factor() == 0.5
    assert scaler.get_growth_interval() == 2000 and scaler._get_growth_tracker() == 0
    assert scaler.is_enabled() and scaler.min_scale is None
    assert scaler.skipped_steps == 0 and scaler.consecutive_skipped_steps == 0
    assert isinstance(gputrain.amp.GradScaler(), gputrain._C.Scaler)


def test_scale_multiplies_floats_arrays_and_containers():
    scaler = GradScaler(init_scale=8.0)
    assert scaler.scale(1.5) == 12.0 and isinstance(scaler.scale(1.5), float)
    loss32 = scaler.scale(np.float32(0.25))
    assert loss32 == np.float32(2.0) and loss32.dtype == np.float32
    arr = scaler.scale(np.array([1.0, -2.0], np.float32))
    assert arr.dtype == np.float32 and np.array_equal(arr, [8.0, -16.0])
    assert scaler.scale(np.array([0.5])).dtype == np.float64
    out = scaler.scale((1.0, [np.float32(2.0), 3.0]))
    assert isinstance(out, tuple) and isinstance(out[1], list) and out[0] == 8.0 and out[1][1] == 24.0
    for bad in (3, True, "loss", None, np.array([1, 2])):
        with pytest.raises(TypeError, match="outputs"):
            scaler.scale(bad)


def test_step_unscales_steps_and_updates():
    grads = [np.full(4, 1024.0, np.float32), None, np.full((2, 3), -512.0, np.float32)]
    params = make_params(grads)
    opt = FakeOptimizer(params[:2], params[2:])
    scaler = GradScaler(init_scale=1024.0, growth_interval=1)
    skipped = scaler.step(opt, 7, flag=True)
    assert skipped is False and opt.steps == 1 and opt.step_args == ((7,), {"flag": True})
    assert np.all(params[0].grad == 1.0) and np.all(params[2].grad == -0.5) and params[1].grad is None
    scaler.update()
    assert scaler.get_scale() == 2048.0 and scaler._get_growth_tracker() == 0


def test_overflow_skips_exactly_that_step_and_the_scheduler_follows():
    rng = np.random.default_rng(3)
    params = make_params([np.zeros(50, np.float32), np.zeros(7, np.float32)])
    opt, sched = FakeOptimizer(params), FakeScheduler()
    scaler = GradScaler(init_scale=2.0**10, growth_interval=4)
    bad_iterations = {5, 6, 13}
    for it in range(20):
        for p in params:
            p.grad = (rng.standard_normal(p.shape) * scaler.get_scale()).astype(np.float32)
        if it in bad_iterations:
            params[it % 2].grad[it % 7] = [np.inf, np.nan][it % 2]
        if not scaler.step(opt):
            sched.step()
        scaler.update()
    assert opt.steps == sched.last_epoch == 20 - len(bad_iterations)
    assert scaler.skipped_steps == 3 and scaler.consecutive_skipped_steps == 0


def test_unscale_twice_and_after_step_raise_like_pytorch():
    params = make_params([np.ones(3, np.float32)])
    opt = FakeOptimizer(params)
    scaler = GradScaler()
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match=r"unscale_\(\) has already been called on this optimizer since the last update\(\)\."):
        scaler.unscale_(opt)
    assert scaler.step(opt) is False and opt.steps == 1  # step() reuses the explicit unscale_
    with pytest.raises(RuntimeError, match=r"unscale_\(\) is being called after step\(\)\."):
        scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match=r"step\(\) has already been called since the last update\(\)\."):
        scaler.step(opt)
    scaler.update()
    scaler.unscale_(opt)  # a new iteration starts clean
    with pytest.raises(RuntimeError, match="Closure"):
        scaler.step(opt, closure=lambda: 0.0)


def test_unscale_then_clip_then_step_unscales_once():
    params = make_params([np.full(5, 64.0, np.float32)])
    opt = FakeOptimizer(params)
    scaler = GradScaler(init_scale=64.0)
    scaler.unscale_(opt)
    assert np.all(params[0].grad == 1.0)
    params[0].grad *= 0.5  # e.g. clipping the unscaled gradients
    scaler.step(opt)
    assert np.all(params[0].grad == 0.5) and opt.steps == 1


def test_inf_in_one_of_two_optimizers():
    good = make_params([np.ones(4, np.float32)])
    bad = make_params([np.array([1.0, np.inf], np.float32)])
    opt_good, opt_bad = FakeOptimizer(good), FakeOptimizer(bad)
    scaler = GradScaler(init_scale=4.0)
    assert scaler.step(opt_good) is False and scaler.step(opt_bad) is True
    assert (opt_good.steps, opt_bad.steps) == (1, 0)
    scaler.update()
    assert scaler.get_scale() == 2.0 and scaler.skipped_steps == 1


def test_update_without_checks_and_update_with_new_scale():
    scaler = GradScaler(init_scale=4.0, growth_interval=3)
    with pytest.raises(RuntimeError, match="No inf checks"):
        scaler.update()
    scaler.unscale_arrays([np.ones(2, np.float32)])
    scaler.update()
    scaler.unscale_arrays([np.array([np.nan], np.float32)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scaler.update(new_scale=0.1)  # set (as float32), the tracker kept, the skip counted
    assert caught == []  # a scale the user chose is not an underflow
    assert scaler.get_scale() == float(np.float32(0.1))
    assert scaler.skipped_steps == 1 and scaler._get_growth_tracker() == 1
    scaler.update(np.array([3.0], np.float32))
    assert scaler.get_scale() == 3.0 and scaler.consecutive_skipped_steps == 0
    for bad, error in ((-1.0, ValueError), (0.0, ValueError), (1e-46, ValueError),  # 0 in float32
                       (float("nan"), ValueError), (float("inf"), ValueError),
                       (1e39, ValueError), ("2", TypeError), (np.ones(2), ValueError), (True, TypeError)):
        with pytest.raises(error, match="new_scale"):
            scaler.update(bad)
    assert scaler.get_scale() == 3.0


def test_fp16_gradients_are_refused_like_pytorch():
    params = make_params([np.ones(2, np.float32)])
    params[0]._grad_storage = np.ones(2, np.float16)  # bypass Parameter's own float32 check
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients."):
        GradScaler().unscale_(FakeOptimizer(params))
    params[0]._grad_storage = np.ones(2, np.float64)
    with pytest.raises(TypeError, match=r"param_groups\[0\]\['params'\]\[0\].grad must be float32"):
        GradScaler().unscale_(FakeOptimizer(params))
    with pytest.raises(TypeError, match="param_groups"):
        GradScaler().step(object())


def test_warns_once_when_the_scale_falls_below_one():
    scaler = GradScaler(init_scale=2.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(4):
            scaler.unscale_arrays([np.array([np.inf], np.float32)])
            scaler.update()
    assert [type(w.message) for w in caught] == [ScaleUnderflowWarning]
    assert "below 1 (now 0.5)" in str(caught[0].message) and caught[0].filename == __file__
    assert scaler.get_scale() == 0.125 and scaler.consecutive_skipped_steps == 4


def test_min_scale_keeps_the_scale_from_collapsing():
    scaler = GradScaler(init_scale=8.0, min_scale=2.0)
    for _ in range(10):
        scaler.unscale_arrays([np.array([np.nan], np.float32)])
        scaler.update()
    assert scaler.get_scale() == 2.0 and scaler.skipped_steps == 10


def test_state_dict_has_pytorch_keys_and_round_trips():
    rng = np.random.default_rng(5)
    a = GradScaler(init_scale=3.0, growth_factor=1.7, backoff_factor=0.3, growth_interval=4)
    for found in rng.random(57) < 0.2:
        a._update(bool(found))
    state = a.state_dict()
    assert list(state) == ["scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"]
    assert state == {"scale": a.get_scale(), "growth_factor": 1.7, "backoff_factor": 0.3,
                     "growth_interval": 4, "_growth_tracker": a._get_growth_tracker()}
    b = GradScaler()
    b.load_state_dict(json.loads(json.dumps(state)))
    assert b.state_dict() == state
    for found in rng.random(200) < 0.2:  # both continue identically
        a._update(bool(found))
        b._update(bool(found))
        assert (a.get_scale(), a._get_growth_tracker()) == (b.get_scale(), b._get_growth_tracker())


def test_load_state_dict_checks_everything_before_changing_anything():
    scaler = GradScaler(init_scale=16.0)
    good = GradScaler(init_scale=2.0).state_dict()
    for key, bad, error in (("growth_factor", 1.0, ValueError), ("backoff_factor", 1.5, ValueError),
                            ("growth_interval", 0, ValueError), ("growth_interval", 2.5, TypeError),
                            ("scale", -1.0, ValueError), ("scale", float("inf"), ValueError),
                            ("_growth_tracker", 2**40, ValueError), ("scale", "x", TypeError)):
        with pytest.raises(error):
            scaler.load_state_dict({**good, key: bad})
        assert scaler.get_scale() == 16.0 and scaler.get_growth_factor() == 2.0
    with pytest.raises(KeyError):
        scaler.load_state_dict({"scale": 1.0})
    with pytest.raises(RuntimeError, match="empty"):
        scaler.load_state_dict({})


def test_disabled_scaler_is_a_no_op():
    scaler = GradScaler(enabled=False)
    params = make_params([np.array([np.inf, 4.0], np.float32)])
    opt = FakeOptimizer(params)
    loss = np.array([2.0], np.float32)
    assert scaler.scale(loss) is loss and scaler.get_scale() == 1.0
    assert scaler.step(opt) is False and opt.steps == 1 and params[0].grad[1] == 4.0
    assert scaler.unscale_arrays([params[0].grad]) is False and params[0].grad[1] == 4.0
    scaler.update()
    assert scaler.state_dict() == {} and not scaler.is_enabled()
    scaler.load_state_dict({})  # ignored, as in PyTorch
    assert scaler._inv_scale == 1.0 and repr(scaler) == "GradScaler(enabled=False)"


def test_setters_validate_and_apply():
    scaler = GradScaler()
    scaler.set_growth_factor(3.0)
    scaler.set_backoff_factor(0.25)
    scaler.set_growth_interval(5)
    assert (scaler.get_growth_factor(), scaler.get_backoff_factor(), scaler.get_growth_interval()) == (3.0, 0.25, 5)
    with pytest.raises(ValueError, match="growth_factor"):
        scaler.set_growth_factor(0.9)
    with pytest.raises(ValueError, match="backoff_factor"):
        scaler.set_backoff_factor(0.0)
    with pytest.raises(ValueError, match="growth_interval"):
        scaler.set_growth_interval(-2)
    assert scaler.get_growth_factor() == 3.0


@pytest.mark.parametrize("kwargs, error, match", [
    ({"growth_factor": 1.0}, ValueError, "growth_factor"),
    ({"growth_factor": float("inf")}, ValueError, "growth_factor"),
    ({"backoff_factor": 1.0}, ValueError, "backoff_factor"),
    ({"backoff_factor": 0.0}, ValueError, "backoff_factor"),
    ({"backoff_factor": float("nan")}, ValueError, "backoff_factor"),
    ({"growth_interval": 0}, ValueError, "growth_interval"),
    ({"growth_interval": 2**31}, ValueError, "growth_interval"),
    ({"growth_interval": 1.5}, TypeError, "growth_interval"),
    ({"growth_interval": True}, TypeError, "growth_interval"),
    ({"init_scale": 0.0}, ValueError, "init_scale"),
    ({"init_scale": -2.0}, ValueError, "init_scale"),
    ({"init_scale": 1e39}, ValueError, "init_scale"),
    ({"init_scale": float("nan")}, ValueError, "init_scale"),
    ({"init_scale": "big"}, TypeError, "init_scale"),
    ({"growth_factor": None}, TypeError, "growth_factor"),
    ({"min_scale": 0.0}, ValueError, "min_scale"),
    ({"min_scale": float("inf")}, ValueError, "min_scale"),
    ({"min_scale": "1"}, TypeError, "min_scale"),
])
def test_constructor_rejects_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        GradScaler(**kwargs)


def test_pickle_and_deepcopy_keep_the_whole_state():
    scaler = GradScaler(init_scale=5.0, growth_interval=3, min_scale=0.5)
    for found in (False, True, True, False):
        scaler._update(found)
    for clone in (pickle.loads(pickle.dumps(scaler)), copy.deepcopy(scaler)):
        assert clone.state_dict() == scaler.state_dict() and clone.min_scale == 0.5
        assert (clone.skipped_steps, clone.consecutive_skipped_steps) == (2, 0)
    scaler.unscale_arrays([np.ones(1, np.float32)])
    with pytest.raises(RuntimeError, match="pickled"):
        pickle.dumps(scaler)


def test_per_optimizer_stages_use_pytorch_names():
    assert [s.name for s in OptState] == ["READY", "UNSCALED", "STEPPED"]


def test_real_optimizer_and_lr_schedule_advance_only_on_real_steps():
    from gputrain import optim

    param = Parameter(np.zeros(6, np.float32), name="w")
    opt = optim.SGD([param], lr=1.0)
    sched = optim.get_linear_schedule_with_warmup(opt, num_warmup_steps=0, num_training_steps=10)
    scaler = GradScaler(init_scale=8.0, growth_interval=100)
    expected = np.zeros(6, np.float64)
    for it in range(8):
        param.grad = np.full(6, 0.5, np.float32) * np.float32(scaler.get_scale())
        if it in (2, 5):
            param.grad[1] = np.inf
        lr, before = opt.param_groups[0]["lr"], param.data.copy()
        if scaler.step(opt):
            assert np.array_equal(param.data, before)  # a skipped step leaves the weights alone
        else:
            expected -= lr * 0.5
            sched.step()
        scaler.update()
        np.testing.assert_allclose(param.data, expected, rtol=1e-6)
    assert sched.last_epoch == 6 and scaler.skipped_steps == 2
    assert opt.param_groups[0]["lr"] == pytest.approx((10 - 6) / 10)

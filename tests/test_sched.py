"""Learning-rate schedules: Hugging Face's formulas (written out independently here), LambdaLR's
PyTorch semantics, get_scheduler's names and argument errors, and state_dict resume."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gputrain.nn import Parameter
from gputrain.optim import SGD, AdamW, LambdaLR, SchedulerType, get_scheduler

WARMUP, TOTAL = 10, 50


def _optimizer(lr: float = 0.5) -> AdamW:
    return AdamW([Parameter(np.zeros(3, np.float32))], lr=lr)


def _expected(name: str, step: int) -> float:
    """The multiplier of the initial lr at optimizer step `step` (HF's definitions)."""
    if name == "constant":
        return 1.0
    if step < WARMUP:
        return step / WARMUP
    progress = (step - WARMUP) / (TOTAL - WARMUP)
    if name == "constant_with_warmup":
        return 1.0
    if name == "linear":
        return max(0.0, (TOTAL - step) / (TOTAL - WARMUP))
    if name == "cosine":
        return max(0.0, 0.5 * (1 + math.cos(math.pi * progress)))
    if name == "cosine_with_restarts":
        return 0.0 if progress >= 1 else 0.5 * (1 + math.cos(math.pi * (progress % 1.0)))
    if name == "polynomial":
        if step > TOTAL:
            return 1e-7 / 0.5
        return ((0.5 - 1e-7) * (1 - progress) + 1e-7) / 0.5
    if name == "inverse_sqrt":
        return 1 / math.sqrt(step / WARMUP)
    raise AssertionError(name)


@pytest.mark.parametrize("name", [t.value for t in SchedulerType])
def test_schedules_follow_hugging_face_formulas(name):
    opt = _optimizer()
    sched = get_scheduler(name, opt, num_warmup_steps=WARMUP, num_training_steps=TOTAL)
    for step in range(TOTAL + 5):
        assert opt.param_groups[0]["lr"] == pytest.approx(0.5 * _expected(name, step), rel=1e-12, abs=1e-15)
        assert sched.get_last_lr() == [opt.param_groups[0]["lr"]]
        assert sched.last_epoch == step
        sched.step()


def test_schedule_reaches_the_c_optimizer():
    p = Parameter(np.ones(4, np.float32))
    opt = SGD([p], lr=1.0)
    sched = get_scheduler("linear", opt, num_warmup_steps=2, num_training_steps=4)
    values = []
    for _ in range(4):
        p.grad = np.ones(4, np.float32)
        before = p.data.copy()
        opt.step()
        values.append(float(before[0] - p.data[0]))
        sched.step()
    np.testing.assert_allclose(values, [0.0, 0.5, 1.0, 0.5], rtol=1e-7)


def test_scheduler_stepped_only_after_real_steps_stays_with_the_optimizer():
    """A training loop steps the schedule only when the optimizer step ran."""
    p = Parameter(np.ones(2, np.float32))
    opt = AdamW([p], lr=1.0)
    sched = get_scheduler("cosine", opt, num_warmup_steps=3, num_training_steps=20)
    for i in range(10):
        p.grad = np.full(2, np.inf if i % 3 == 1 else 1.0, np.float32)  # steps 1, 4, 7 overflow
        opt.clip_grad_norm_(1.0, skip_if_nonfinite=True)
        opt.step()
        if not opt.last_step_skipped:
            sched.step()
    assert opt.step_count == sched.last_epoch == 7


def test_per_group_base_lrs_are_kept():
    params = [Parameter(np.zeros(2, np.float32)) for _ in range(2)]
    opt = AdamW([{"params": [params[0]], "lr": 1.0}, {"params": [params[1]], "lr": 0.1}])
    sched = get_scheduler("linear", opt, num_warmup_steps=0, num_training_steps=10)
    sched.step()
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.9, 0.09])
    assert [g["initial_lr"] for g in opt.param_groups] == [1.0, 0.1]


def test_state_dict_resumes_the_schedule():
    opt = _optimizer()
    sched = get_scheduler("cosine", opt, num_warmup_steps=WARMUP, num_training_steps=TOTAL)
    for _ in range(17):
        sched.step()
    saved = sched.state_dict()
    assert "optimizer" not in saved and saved["last_epoch"] == 17
    opt2 = _optimizer()
    opt2.param_groups[0]["initial_lr"] = 0.5
    sched2 = get_scheduler("cosine", opt2, num_warmup_steps=WARMUP, num_training_steps=TOTAL)
    sched2.load_state_dict(saved)
    sched.step()
    sched2.step()
    assert sched2.get_last_lr() == sched.get_last_lr()
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]


def test_scheduler_specific_kwargs_and_inverse_sqrt_timescale():
    opt = _optimizer()
    get_scheduler("cosine_with_restarts", opt, 0, 10, scheduler_specific_kwargs={"num_cycles": 2})
    opt2 = _optimizer()
    sched = get_scheduler("inverse_sqrt", opt2, 0, scheduler_specific_kwargs={"timescale": 4})
    for _ in range(12):
        sched.step()
    assert opt2.param_groups[0]["lr"] == pytest.approx(0.5 / math.sqrt((12 + 4) / 4))  # shift = timescale - warmup
    with pytest.raises(TypeError):
        get_scheduler("linear", _optimizer(), 1, 10, scheduler_specific_kwargs={"bogus": 1})


def test_bad_arguments():
    with pytest.raises(ValueError, match="is not a valid SchedulerType"):
        get_scheduler("exponential", _optimizer(), 1, 10)
    with pytest.raises(ValueError, match="linear requires `num_warmup_steps`"):
        get_scheduler("linear", _optimizer())
    with pytest.raises(ValueError, match="cosine requires `num_training_steps`"):
        get_scheduler("cosine", _optimizer(), num_warmup_steps=3)
    with pytest.raises(ValueError, match="lr_end"):
        get_scheduler("polynomial", _optimizer(lr=1e-8), 1, 10)
    with pytest.raises(KeyError, match="initial_lr"):
        LambdaLR(_optimizer(), lambda step: 1.0, last_epoch=5)
    with pytest.raises(ValueError, match="Expected 1 lr_lambdas"):
        LambdaLR(_optimizer(), [lambda s: 1.0, lambda s: 2.0])
    assert isinstance(get_scheduler("constant", _optimizer()), LambdaLR)


@pytest.mark.parametrize("name", [t.value for t in SchedulerType])
def test_lrs_ahead_are_what_stepping_sets_and_change_nothing(name):
    opt = AdamW([Parameter(np.zeros(3, np.float32))], lr=0.5)
    opt.add_param_group({"params": [Parameter(np.zeros(2, np.float32))], "lr": 0.25})
    sched = get_scheduler(name, opt, num_warmup_steps=WARMUP, num_training_steps=TOTAL)
    for _ in range(7):
        sched.step()
    before = sched.state_dict()
    ahead = sched.lrs_ahead(TOTAL)
    assert sched.state_dict() == before and [g["lr"] for g in opt.param_groups] == ahead[0]
    for j in range(1, TOTAL):
        sched.step()
        assert [g["lr"] for g in opt.param_groups] == ahead[j], j  # exact: the same float operations


def test_lrs_ahead_start_from_a_group_lr_set_by_hand():
    opt = _optimizer()
    sched = get_scheduler("linear", opt, num_warmup_steps=WARMUP, num_training_steps=TOTAL)
    opt.param_groups[0]["lr"] = 0.125  # the next update uses it; step() then sets the schedule's
    assert sched.lrs_ahead(2) == [[0.125], [0.5 * 1 / WARMUP]]


def test_lrs_ahead_count_is_checked():
    sched = get_scheduler("constant", _optimizer())
    with pytest.raises(ValueError, match="count"):
        sched.lrs_ahead(0)
    with pytest.raises(TypeError, match="count"):
        sched.lrs_ahead(2.0)

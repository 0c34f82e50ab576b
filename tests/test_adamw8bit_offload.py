"""8-bit AdamW with its state offloaded to pinned host memory (AdamW8bit(cpu_offload_fraction=f),
is_paged=True, TrainingArguments(optim="paged_adamw_8bit")): the same bits as the state on the
device for any fraction and staging chunk (chunks of whole blocks, a partial last block, 32-bit
parameters among the offloaded ones), on the CPU and on sim; whole parameters offloaded from
the boundary nearest to f; the plan equal to what is built and to a sim run's peak in both pools;
the state_dict moving between offloaded and device optimizers; the Trainer resuming exactly."""

from __future__ import annotations

import numpy as np
import pytest

import gputrain as gt
from gputrain import _C
from gputrain.nn import Parameter
from gputrain.optim import AdamW, AdamW8bit
from test_adamw8bit import _args, _classes, assert_bits, whole_and_resumed
from test_memory_plan import measured

nn = gt.nn


def _model():
    gt.random.manual_seed(1)
    # 12*40 + 40 = 520 (32-bit), 40*150 = 6000 weights (8-bit: 23 blocks and a partial one),
    # then 150 + 150 + 150 (32-bit) and 150*4 + 4 (32-bit)
    return nn.Sequential(nn.Linear(12, 40), nn.GELU(), nn.Linear(40, 150), nn.GELU(), nn.LayerNorm(150),
                         nn.Linear(150, 4))


def _train(device, steps=4, **optimizer_kwargs):
    x, y = _classes(32)
    m = _model().to(device)
    opt = AdamW8bit(m.parameters(), lr=1e-2, **optimizer_kwargs)
    step = gt.TrainStep(m, nn.CrossEntropyLoss(), opt, max_grad_norm=1.0)
    losses = [step(x, y).loss for _ in range(steps)]
    return losses, m.state_dict(), opt.state_dict()["state"], opt


def _assert_same(a, b):
    (loss_a, model_a, state_a, _), (loss_b, model_b, state_b, _) = a, b
    assert loss_a == loss_b
    for name in model_a:
        assert_bits(model_a[name], model_b[name], name)
    assert state_a.keys() == state_b.keys()
    for index in state_a:
        assert state_a[index].keys() == state_b[index].keys()
        for key in state_a[index]:
            assert_bits(np.asarray(state_a[index][key]), np.asarray(state_b[index][key]), f"{index}.{key}")


@pytest.mark.parametrize("device", ["cpu", pytest.param("sim", marks=pytest.mark.sim)])
@pytest.mark.parametrize("fraction, chunk", [(1.0, 0), (1.0, 512), (0.5, 300), (0.1, 256)])
def test_offloaded_state_trains_the_device_bits(device, fraction, chunk):
    on_device = _train(device)
    offloaded = _train(device, cpu_offload_fraction=fraction, offload_chunk_numel=chunk)
    _assert_same(on_device, offloaded)
    assert offloaded[3].memory()["host_bytes"] > 0


def test_whole_parameters_move_from_the_boundary_nearest_the_fraction():
    numels = [p.numel() for p in _model().parameters()]  # 480, 40, 6000, 150, 150, 150, 600, 4
    total = sum(numels)
    tail = 150 + 150 + 150 + 600 + 4  # the bias of Linear(40, 150), the LayerNorm, the last Linear
    for fraction, offloaded in ((0.0, 0), (0.1, 754), (0.5, tail), (0.9, 6000 + tail), (0.95, 40 + 6000 + tail),
                                (1.0, total)):  # the last 757.4, 3787, 6816.6, 7195.3 elements
        plan = _C.optimizer_plan("adamw8bit", numels, [{}], cpu_offload_fraction=fraction)
        built = AdamW8bit(_model().parameters(), cpu_offload_fraction=fraction).memory()
        assert (plan["device_bytes"], plan["pinned_bytes"]) == (built["device_bytes"], built["host_bytes"]), fraction
        assert built["host_numel"] == offloaded and built["device_numel"] == total - offloaded, fraction
        assert (plan["pinned_bytes"] > 0) == (fraction > 0)
    assert _C.optimizer_plan("adamw8bit", numels, [{}], cpu_offload_fraction=1.0)["device_bytes"] == 0


def test_the_state_dict_moves_between_offloaded_and_device_optimizers():
    x, y = _classes(32)
    finals = []
    for first, second in ((0.0, 0.0), (1.0, 0.0), (0.0, 0.7)):
        m = _model()
        opt = AdamW8bit(m.parameters(), lr=1e-2, cpu_offload_fraction=first)
        step = gt.TrainStep(m, nn.CrossEntropyLoss(), opt)
        for _ in range(2):
            step(x, y)
        saved = opt.state_dict()
        opt = AdamW8bit(m.parameters(), lr=1e-2, cpu_offload_fraction=second)
        opt.load_state_dict(saved)
        step = gt.TrainStep(m, nn.CrossEntropyLoss(), opt)
        finals.append((step(x, y).loss, m.state_dict(), opt.state_dict()["state"], opt))
    _assert_same(finals[0], finals[1])
    _assert_same(finals[0], finals[2])


@pytest.mark.sim
def test_a_paged_sim_run_peaks_at_its_plan_in_both_pools(tmp_path):
    x, y = _classes()
    m = _model().to("sim")
    with measured() as growth:
        gt.reset_peak_memory_stats("sim:0")
        trainer = gt.Trainer(m, _args(tmp_path, device="sim", optim="paged_adamw_8bit"), train_dataset=(x, y))
        plan = trainer.memory_plan()
        trainer.train()
        device_peak = gt.memory_stats("sim:0")["peak_reserved_bytes"]
    assert trainer.optimizer.cpu_offload_fraction == 1.0 and isinstance(trainer.optimizer, AdamW8bit)
    assert "optimizer_state" not in plan["sim:0"] and plan["pinned"]["optimizer_offload"] > 0
    assert device_peak == plan.total("sim:0"), str(plan)
    assert growth["pinned"] == plan.total("pinned"), str(plan)


def test_the_trainer_with_paged_adamw_8bit_resumes_bit_identically(tmp_path):
    whole, resumed = whole_and_resumed(tmp_path, _model, optim="paged_adamw_8bit", max_steps=6,
                                       cpu_offload_fraction=0.5)
    assert whole.optimizer.cpu_offload_fraction == 0.5
    _assert_same((0, whole.model.state_dict(), whole.optimizer.state_dict()["state"], None),
                 (0, resumed.model.state_dict(), resumed.optimizer.state_dict()["state"], None))


def test_the_paged_names_choose_the_optimizer_and_its_fraction(tmp_path):
    assert _args(tmp_path, optim="paged_adamw_8bit").cpu_offload_fraction == 1.0
    assert _args(tmp_path, optim="paged_adamw_8bit", cpu_offload_fraction=0.25).cpu_offload_fraction == 0.25
    assert _args(tmp_path, optim="paged_adamw_8bit", cpu_offload_fraction=0.0).cpu_offload_fraction == 0.0
    assert _args(tmp_path, optim="adamw_8bit").cpu_offload_fraction == 0.0
    x, y = _classes(16)
    trainer = gt.Trainer(_model(), _args(tmp_path, optim="paged_adamw_32bit", max_steps=1), train_dataset=(x, y))
    trainer.train()
    assert isinstance(trainer.optimizer, AdamW) and trainer.optimizer.cpu_offload_fraction == 1.0
    p = Parameter(np.zeros(5000, np.float32))
    assert AdamW8bit([p], is_paged=True).cpu_offload_fraction == 1.0
    assert AdamW8bit([p], is_paged=True, cpu_offload_fraction=0.5).cpu_offload_fraction == 0.5
    with pytest.raises(ValueError, match="cpu_offload_fraction"):
        AdamW8bit([p], cpu_offload_fraction=1.5)
    with pytest.raises(TypeError, match="is_paged must be a bool"):
        AdamW8bit([p], is_paged="yes")

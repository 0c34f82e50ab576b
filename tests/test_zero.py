"""ZeRO-1 (AdamW(zero_stage=1)) in one process: its arguments, the C optimizer's shard settings,
the step's refusal of a shard without its communicator, and the memory plan of a shard. The
multi-rank runs (bit-identity with unsharded data parallelism, checkpoints across world sizes)
are in test_distributed.py."""

from __future__ import annotations

import numpy as np
import pytest

import gputrain as gt
from gputrain import _C
from gputrain import distributed as dist
from gputrain.memory_plan import OptimizerSpec, plan_training

nn = gt.nn


def mlp():
    gt.random.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 3))


@pytest.mark.parametrize("value, error, words", [
    (2, ValueError, "stages 2 and 3"), (-1, ValueError, "zero_stage must be 0"), ("1", TypeError, "zero_stage"),
    (True, TypeError, "zero_stage"), (1.0, TypeError, "zero_stage"),
])
def test_bad_zero_stage_raises_naming_it(value, error, words):
    with pytest.raises(error, match=words):
        gt.optim.AdamW(mlp().parameters(), zero_stage=value)


def test_zero_stage_1_in_one_process_is_zero_stage_0():
    """Without distributed.init() (or with one rank) there is one shard, the whole state: the same
    training, state_dict and memory."""
    dist.destroy()
    runs = []
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((8, 6)).astype(np.float32), rng.integers(0, 3, 8)
    for stage in (0, 1):
        model = mlp()
        optimizer = gt.optim.AdamW(model.parameters(), lr=0.1, cpu_offload_fraction=0.5, zero_stage=stage)
        step = gt.TrainStep(model, nn.CrossEntropyLoss(), optimizer, max_grad_norm=0.1)
        for _ in range(3):
            step(x, y)
        assert optimizer.zero_stage == stage and optimizer._shard is None
        runs.append((model.state_dict(), optimizer.state_dict(), optimizer.memory()))
    for name, value in runs[0][0].items():
        assert np.array_equal(runs[1][0][name], value), name
    for index, state in runs[0][1]["state"].items():
        for name, value in state.items():
            assert np.array_equal(runs[1][1]["state"][index][name], value), (index, name)
    assert runs[0][2] == runs[1][2]


@pytest.mark.parametrize("size, rank", [(-1, 0), (2, 2), (2, -1)])
def test_c_optimizer_refuses_a_bad_shard(size, rank):
    with pytest.raises(ValueError, match="zero_rank"):
        _C.Optimizer("adamw", [np.zeros(4, np.float32)], [0], [{}], zero_size=size, zero_rank=rank)


def test_a_shard_without_its_communicator_is_refused_and_nothing_changes():
    """A C optimizer sharded for rank 0 of 2, in a step of one process: ValueError naming
    zero_stage before anything ran; the weights stay as they were."""
    model = mlp()
    flat, grads = model.compiled.parameter_arrays()
    core = _C.Optimizer("adamw", [flat[:flat.size // 2]], [0], [{}], grads=[grads[:flat.size // 2]],
                        zero_size=2, zero_rank=0)
    before = flat.copy()
    x, y = np.ones((2, 6), np.float32), np.zeros(2, np.int64)
    with pytest.raises(ValueError, match="zero_stage=1 sharded it for rank 0 of 2"):
        _C.train_step(_C.StepConfig(nn.CrossEntropyLoss()._spec(), optimizer=core), model.compiled, x, y)
    assert np.array_equal(flat, before) and core.num_steps == 0


def test_memory_plan_of_a_shard_is_one_ranks():
    """zero_shards=N plans the largest shard's state, ceil(numel / N) elements, and says so."""
    model = mlp()
    numel = model.compiled.num_parameters
    whole = plan_training(model, (4, 6), optimizer=OptimizerSpec("adamw", (numel,), cpu_offload_fraction=0.5))
    shard = plan_training(model, (4, 6), optimizer=OptimizerSpec("adamw", (numel,), cpu_offload_fraction=0.5,
                                                                  zero_shards=3))
    expected = _C.optimizer_plan("adamw", [-(-numel // 3)], [{}], cpu_offload_fraction=0.5)
    assert shard["cpu"]["optimizer_state"] == expected["device_bytes"] < whole["cpu"]["optimizer_state"]
    assert shard["pinned"]["optimizer_offload"] == expected["pinned_bytes"] < whole["pinned"]["optimizer_offload"]
    assert shard.settings["optimizer_shards"] == 3 and "optimizer_shards=3" in str(shard)
    assert "optimizer_shards" not in whole.settings
    with pytest.raises(ValueError, match="zero_shards"):
        plan_training(model, (4, 6), optimizer=OptimizerSpec("adamw", (numel,), zero_shards=0))

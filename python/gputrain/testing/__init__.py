"""Testing helpers for users' test and benchmark suites (the pytest plugin: python/_gputrain_pytest.py).

    from gputrain.testing import assert_memory_within, assert_reproducible

    def test_step_fits(gputrain_benchmark):
        result = gputrain_benchmark.train_step(step, x, y)       # samples/s, plan, peaks -> extra_info
        assert_memory_within(result, {"cpu": 64 << 20})         # plan and allocator peak per kind

    def test_same_seed_same_bits():
        assert_reproducible(lambda: train(steps=5), seed=0)    # weights and optimizer state
"""

from __future__ import annotations

from gputrain.testing.benchmark import (
    StepBenchmark,
    StepResult,
    assert_step_time_within,
    machine_facts,
    time_steps,
)
from gputrain.testing.determinism import assert_bit_identical, assert_reproducible, seed_all, training_state
from gputrain.testing.memory import assert_memory_within, memory_kinds, memory_plan, peak_memory, reset_peak_memory

__all__ = [
    "StepBenchmark",
    "StepResult",
    "assert_bit_identical",
    "assert_memory_within",
    "assert_reproducible",
    "assert_step_time_within",
    "machine_facts",
    "memory_kinds",
    "memory_plan",
    "peak_memory",
    "reset_peak_memory",
    "seed_all",
    "time_steps",
    "training_state",
]

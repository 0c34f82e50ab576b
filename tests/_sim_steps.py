"""A model trained a few steps on the CPU and on the simulated device: the same losses and the same
bits, and sim's peak memory exactly the step's plan (tests/test_qlinear.py, tests/test_qlora.py)."""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from typing import Any

import gputrain as gt
import gputrain.memory_plan as mp

import _reference as ref


def assert_sim_gives_the_cpu_bits_at_its_plan(build: Callable[[], gt.nn.Module],
                                              make_step: Callable[[gt.nn.Module], gt.TrainStep],
                                              batches: Sequence[tuple[Any, ...]], input_shape: tuple[int, ...]
                                              ) -> dict[str, Any]:
    """Builds build()'s model for each device, moves it to "sim:0" there, runs make_step(model) on
    each batch (the step's arguments), and compares; returns the CPU model's state_dict."""
    def trained(device: str) -> tuple[list[float], dict[str, Any]]:
        gc.collect()  # the sim models of earlier tests: their memory is not this plan's
        model = build()
        if device != "cpu":
            model = model.to(device)
            gt.reset_peak_memory_stats(device)
        step = make_step(model)
        plan = mp.plan_step(step, input_shape)
        losses = [step(*batch).loss for batch in batches]
        if device != "cpu":
            assert gt.memory_stats(device)["peak_reserved_bytes"] == plan.total(device), str(plan)
        return losses, model.state_dict()

    (cpu_losses, cpu_state), (sim_losses, sim_state) = trained("cpu"), trained("sim:0")
    assert cpu_losses == sim_losses
    assert all(ref.same_bits(cpu_state[k], sim_state[k]) for k in cpu_state)
    return cpu_state

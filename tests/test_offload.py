"""CPU offload of the optimizer (cpu_offload_fraction): the same results for every fraction
(with clipping and a loss scaler skipping steps), exact memory accounting of the "device"
(cpu pool) and host (pinned pool) shares, state access across the split, and the staging
pipeline with many small chunks. On this machine the device is the CPU, so the split, the
staging copies (on a copy thread) and the accounting run the GPU build's code path."""

from __future__ import annotations

import numpy as np
import pytest

import gputrain
from gputrain.amp import GradScaler
from gputrain.nn import Parameter
from gputrain.optim import AdamW

from _optim_reference import ulp_diff

FRACTIONS = [0.0, 0.25, 0.5, 1.0]
SHAPES = [(64, 48), (1000,), (8,), (32, 40), (2832,)]  # 8192 elements: every split is 64-byte aligned


def _arena_params(seed: int) -> tuple[np.ndarray, np.ndarray, list[Parameter]]:
    """Parameters as views into one array (a model's arena), gradients likewise."""
    rng = np.random.default_rng(seed)
    total = sum(int(np.prod(s)) for s in SHAPES)
    data = rng.standard_normal(total).astype(np.float32)
    grads = np.zeros(total, np.float32)
    params, start = [], 0
    for s in SHAPES:
        n = int(np.prod(s))
        params.append(Parameter(data[start:start + n].reshape(s)))
        start += n
    return data, grads, params


def _train(fraction: float, steps: int = 40, chunk: int = 700, **options) -> tuple[np.ndarray, dict, list[bool]]:
    data, _, params = _arena_params(0)
    opt = AdamW(params, lr=1e-2, weight_decay=0.1, cpu_offload_fraction=fraction, offload_chunk_numel=chunk,
                **options)
    scaler = GradScaler(init_scale=2.0**10, growth_interval=5)
    rng = np.random.default_rng(1)
    skipped = []
    for step in range(steps):
        opt.zero_grad()
        for i, p in enumerate(params):
            if i == 2 and step % 4 == 0:
                continue  # this parameter sometimes gets no gradient
            g = rng.standard_normal(p.shape).astype(np.float32) * np.float32(scaler.get_scale())
            if step % 7 == 3 and i == 1:
                g[5] = np.inf  # overflow: the scaler skips this step
            p.grad = g
        scaler.unscale_(opt)
        opt.clip_grad_norm_(5.0)
        skipped.append(scaler.step(opt))
        scaler.update()
    return data.copy(), opt.state_dict(), skipped


def test_results_are_bit_identical_for_every_fraction():
    reference, ref_state, ref_skipped = _train(0.0)
    assert any(ref_skipped) and not all(ref_skipped)
    for fraction in FRACTIONS[1:]:
        data, state, skipped = _train(fraction)
        assert skipped == ref_skipped
        assert ulp_diff(data, reference) == 0, fraction
        for index, entry in ref_state["state"].items():
            for name in ("exp_avg", "exp_avg_sq"):
                np.testing.assert_array_equal(state["state"][index][name], entry[name])
            assert float(state["state"][index]["step"]) == float(entry["step"])


@pytest.mark.parametrize("chunk, amsgrad", [(1, False), (37, True), (4096, False), (0, True)])
def test_chunk_size_does_not_change_results(chunk, amsgrad):
    reference, _, _ = _train(0.0, steps=6, amsgrad=amsgrad)
    data, _, _ = _train(0.5, steps=6, chunk=chunk, amsgrad=amsgrad)
    assert ulp_diff(data, reference) == 0


@pytest.mark.parametrize("fraction", FRACTIONS)
def test_device_optimizer_memory_is_exactly_one_minus_f_of_full(fraction):
    _, _, params = _arena_params(2)
    total = sum(p.numel() for p in params)
    chunk = 1024
    cpu_before = gputrain.memory_stats("cpu")["allocated_bytes"]
    pinned_before = gputrain.memory_stats("pinned")["allocated_bytes"]
    opt = AdamW(params, cpu_offload_fraction=fraction, offload_chunk_numel=chunk)
    device_bytes = gputrain.memory_stats("cpu")["allocated_bytes"] - cpu_before
    host_bytes = gputrain.memory_stats("pinned")["allocated_bytes"] - pinned_before
    full = 2 * 4 * total  # exp_avg and exp_avg_sq
    offloaded = int(round(fraction * total))
    assert device_bytes == (1 - fraction) * full
    expected_host = 0 if offloaded == 0 else 3 * 4 * offloaded + 2 * 4 * min(chunk, offloaded)
    assert host_bytes == expected_host  # master copy + state + two staging buffers, exactly
    assert opt.memory() == {"device_bytes": device_bytes, "host_bytes": host_bytes,
                            "device_numel": total - offloaded, "host_numel": offloaded}
    del opt
    assert gputrain.memory_stats("cpu")["allocated_bytes"] == cpu_before
    assert gputrain.memory_stats("pinned")["allocated_bytes"] == pinned_before


def test_state_dict_round_trip_across_the_split():
    data_a, _, params_a = _arena_params(3)
    data_b, _, params_b = _arena_params(3)
    opt_a = AdamW(params_a, lr=1e-2, cpu_offload_fraction=0.3, offload_chunk_numel=500)
    opt_b = AdamW(params_b, lr=1e-2, cpu_offload_fraction=0.7, offload_chunk_numel=300)
    rng = np.random.default_rng(4)
    grads = [[rng.standard_normal(p.shape).astype(np.float32) for p in params_a] for _ in range(6)]
    for g in grads[:3]:
        for p, gi in zip(params_a, g):
            p.grad = gi
        opt_a.step()
    data_b[...] = data_a
    opt_b.load_state_dict(opt_a.state_dict())  # also re-reads the offloaded parameters
    for g in grads[3:]:
        for pa, pb, gi in zip(params_a, params_b, g):
            pa.grad, pb.grad = gi, gi
        opt_a.step()
        opt_b.step()
    assert ulp_diff(data_a, data_b) == 0


def test_reload_params_after_changing_offloaded_parameters():
    data, _, params = _arena_params(5)
    opt = AdamW(params, lr=1e-2, weight_decay=0.0, cpu_offload_fraction=1.0)
    data[...] = 2.0  # e.g. model.load_state_dict: the host master copy is now stale
    opt.reload_params()
    for p in params:
        p.grad = np.zeros(p.shape, np.float32)
    opt.step()
    np.testing.assert_array_equal(data, 2.0)


def test_bad_offload_arguments():
    params = _arena_params(6)[2]
    for bad in (1.01, -0.5, float("nan")):
        with pytest.raises(ValueError, match="cpu_offload_fraction"):
            AdamW(params, cpu_offload_fraction=bad)
    with pytest.raises(TypeError, match="cpu_offload_fraction"):
        AdamW(params, cpu_offload_fraction="half")
    with pytest.raises(ValueError, match="offload_chunk_numel"):
        AdamW(params, offload_chunk_numel=-1)

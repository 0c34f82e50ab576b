"""EMA of the weights: the lerp rule against a NumPy reference (bit for bit, every SIMD level),
device and host (pinned) shadows, swap / context manager, warmup, state_dict, bad arguments."""

from __future__ import annotations

import numpy as np
import pytest

import gputrain
from gputrain import _C
from gputrain.nn import Parameter
from gputrain.optim import EMA

from _optim_reference import lerp, ulp_diff

LEVELS = ["scalar", "avx2", "avx512"]


def _params(seed: int, shapes=((40_000,), (3, 7), (1,), (257,))) -> list[Parameter]:
    rng = np.random.default_rng(seed)
    return [Parameter(rng.standard_normal(s).astype(np.float32)) for s in shapes]


def _perturb(params, rng) -> None:
    for p in params:
        p.data[...] = p.data + rng.standard_normal(p.shape).astype(np.float32) * np.float32(0.1)


@pytest.mark.parametrize("location", ["device", "host"])
@pytest.mark.parametrize("decay", [0.999, 0.9, 0.3])  # 1 - 0.3 >= 0.5: lerp's other FMA form
def test_update_matches_lerp_reference_at_every_simd_level(location, decay):
    best = _C.build_info()["simd_supported"]
    try:
        for level in LEVELS[: LEVELS.index(best) + 1]:
            _C.set_simd_level(level)
            params = _params(1)
            ema = EMA(params, decay=decay, location=location)
            reference = [p.data.copy() for p in params]
            rng = np.random.default_rng(2)
            for _ in range(5):
                _perturb(params, rng)
                ema.update()
                reference = [lerp(r, p.data, 1 - decay) for r, p in zip(reference, params)]
            for shadow, ref in zip(ema.shadow, reference):
                assert ulp_diff(shadow, ref) == 0
    finally:
        _C.set_simd_level(best)


def test_swap_and_context_manager_restore_exactly():
    params = _params(3)
    trained = [p.data.copy() for p in params]
    ema = EMA(params, decay=0.5)
    _perturb(params, np.random.default_rng(4))
    ema.update()
    trained = [p.data.copy() for p in params]
    average = ema.shadow
    with ema.average_parameters():
        assert ema.swapped
        for p, a in zip(params, average):
            np.testing.assert_array_equal(p.data, a)
        with pytest.raises(RuntimeError, match="swapped"):
            ema.update()
    assert not ema.swapped
    for p, t in zip(params, trained):
        np.testing.assert_array_equal(p.data, t)
    ema.copy_to()
    for p, a in zip(params, average):
        np.testing.assert_array_equal(p.data, a)


def test_adjacent_parameters_average_as_one_run():
    arena = np.arange(1000, dtype=np.float32)
    views = [Parameter(arena[:600]), Parameter(arena[600:])]
    ema = EMA(views, decay=0.9)
    arena += 1.0
    ema.update()
    np.testing.assert_array_equal(np.concatenate(ema.shadow), lerp(np.arange(1000, dtype=np.float32), arena, 0.1))


def test_memory_location_and_accounting():
    params = _params(5, shapes=((1024,), (512,)))
    cpu_before = gputrain.memory_stats("cpu")["allocated_bytes"]
    pinned_before = gputrain.memory_stats("pinned")["allocated_bytes"]
    on_device = EMA(params)
    assert gputrain.memory_stats("cpu")["allocated_bytes"] - cpu_before == 1536 * 4
    on_host = EMA(params, location="host")
    assert gputrain.memory_stats("pinned")["allocated_bytes"] - pinned_before == 1536 * 4
    assert on_device.memory() == {"bytes": 1536 * 4, "location": "device"}
    assert on_host.memory()["location"] == "host"
    del on_device, on_host
    assert gputrain.memory_stats("cpu")["allocated_bytes"] == cpu_before


def test_warmup_decay():
    ema = EMA(_params(6), decay=0.999, use_warmup=True)
    decays = []
    for _ in range(3):
        decays.append(ema.current_decay())
        ema.update()
    assert decays == [1 / 10, 2 / 11, 3 / 12]
    assert EMA(_params(6), decay=0.5, use_warmup=True).current_decay() == 0.1


def test_state_dict_round_trip():
    params = _params(7)
    ema = EMA(params, decay=0.8)
    _perturb(params, np.random.default_rng(8))
    ema.update()
    saved = ema.state_dict()
    other = EMA(_params(9), decay=0.1)
    other.load_state_dict(saved)
    assert other.decay == 0.8 and other.num_updates == 1
    for a, b in zip(other.shadow, ema.shadow):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="expected shape"):
        other.load_state_dict({**saved, "shadow": [np.zeros(3)] * 4})
    with pytest.raises(ValueError, match="shadow arrays"):
        other.load_state_dict({**saved, "shadow": []})


def test_bad_arguments():
    params = _params(10)
    with pytest.raises(ValueError, match="ema_decay"):
        EMA(params, decay=1.5)
    with pytest.raises(TypeError, match="decay"):
        EMA(params, decay="high")
    with pytest.raises(ValueError, match="location"):
        EMA(params, location="gpu")
    with pytest.raises(ValueError, match="empty"):
        EMA([])
    with pytest.raises(TypeError, match="Parameters"):
        EMA([np.zeros(3, np.float32)])
    with pytest.raises(TypeError, match="float32"):
        _C.EMA([np.zeros(3)])
    with pytest.raises(ValueError, match="decay"):
        _C.EMA([np.zeros(3, np.float32)]).update(2.0)
    with pytest.raises(IndexError):
        _C.EMA([np.zeros(3, np.float32)]).get(1)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_swapped_average_reaches_a_half_precision_model(precision):
    """A bf16/fp16 model computes with a half copy of its weights: swap() and copy_to() must
    refresh it, or evaluation with the average silently uses the trained weights."""
    gputrain.random.manual_seed(0)
    model = gputrain.nn.Sequential(gputrain.nn.Linear(6, 8), gputrain.nn.GELU(), gputrain.nn.Linear(8, 3))
    step = gputrain.TrainStep(model, gputrain.nn.CrossEntropyLoss(), gputrain.optim.SGD(model.parameters(), lr=0.5),
                        precision=precision)
    ema = EMA(model, decay=0.5)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 6)).astype(np.float32)
    for _ in range(3):
        step(x, rng.integers(0, 3, 16))
        ema.update()
    model.eval()
    trained_out = model(x)
    average = {name: value for name, value in zip(model.state_dict(), ema.shadow)}
    with ema.average_parameters():
        swapped_out = model(x)
    np.testing.assert_array_equal(model(x), trained_out)
    trained = model.state_dict()
    model.load_state_dict(average)  # writes the fp32 weights and refreshes the half copy
    np.testing.assert_array_equal(swapped_out, model(x))
    model.load_state_dict(trained)
    ema.copy_to()
    np.testing.assert_array_equal(model(x), swapped_out)

"""Mixed precision in the training step: fp16/bf16 activations with fp32 master weights, the
loss scaler inside the fused step, and the smaller activation plan."""

from __future__ import annotations

import numpy as np
import pytest

import gputrain as gt
from _digits import digits

nn = gt.nn


def train_digits(precision, epochs=20, scaler=None, seed=0):
    x_train, y_train, x_test, y_test = digits()
    gt.random.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 10))
    optimizer = gt.optim.AdamW(model.parameters(), lr=2e-3)
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), optimizer, precision=precision, scaler=scaler)
    rng = np.random.default_rng(seed)
    for _ in range(epochs):
        order = rng.permutation(len(x_train))
        for i in range(0, len(order) - 31, 32):
            step(x_train[order[i:i + 32]], y_train[order[i:i + 32]])
    return (model.eval()(x_test).argmax(1) == y_test).mean(), model


@pytest.fixture(scope="module")
def fp32_accuracy():
    return train_digits("fp32")[0]


def test_bf16_trains_as_well_as_fp32(fp32_accuracy):
    accuracy, model = train_digits("bf16")
    assert accuracy >= fp32_accuracy - 0.005, (accuracy, fp32_accuracy)
    assert model.compiled.precision == "bf16"


def test_fp16_with_a_loss_scaler_trains_as_well_as_fp32(fp32_accuracy):
    accuracy, _ = train_digits("fp16", scaler=gt.amp.GradScaler())
    assert accuracy >= fp32_accuracy - 0.005, (accuracy, fp32_accuracy)


def test_half_precision_halves_the_activation_plan():
    gt.random.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 512), nn.GELU(), nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 10))
    f32 = model.compiled.plan((256, 64), precision="f32")
    bf16 = model.compiled.plan((256, 64), precision="bf16")
    assert bf16["activations"] * 2 == pytest.approx(f32["activations"], rel=0.01)
    assert bf16["half_parameters"] == 2 * model.num_parameters()
    assert bf16["parameters"] == f32["parameters"]  # fp32 master weights either way


@pytest.mark.parametrize("tied", [False, True])
def test_the_half_copy_leaves_out_a_lookup_table_no_gemm_reads(tied):
    """In bf16 the GEMMs read a half copy of the parameters; a token table is read by row lookups
    in f32 and has none, unless the LM head is tied to it (the head's GEMM reads it): the plan says
    so to the byte, and on sim the allocator holds exactly that."""
    from gputrain.models.hf import decoder_models as dm

    config = {"model_type": "qwen2", "vocab_size": 96, "hidden_size": 32, "intermediate_size": 48,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "tie_word_embeddings": tied}  # qwen2: q/k/v projections with biases
    model = dm.Qwen2ForCausalLM(config)
    table = 96 * 32
    shape = (2, 3, 8)  # (batch, ids / mask / positions, seq)
    plan = model.compiled.plan(shape, precision="bf16")
    assert plan["half_parameters"] == 2 * (model.num_parameters() - (0 if tied else table))
    assert plan["parameters"] == 4 * model.num_parameters()
    sim = dm.Qwen2ForCausalLM(config).to("sim")
    sim.compiled.precision = "bf16"
    assert sim.compiled.live_arenas()["half_parameters"] == sim.compiled.arena_plan(shape, precision="bf16")[
        "half_parameters"] >= plan["half_parameters"]


def test_half_forward_is_the_f32_forward_rounded():
    gt.random.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).eval()
    x = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    reference = model(x)
    model.compiled.precision = "bf16"
    half = model(x)
    assert not np.array_equal(half, reference)
    np.testing.assert_allclose(half, reference, rtol=0.05, atol=0.05)
    assert np.array_equal(gt.cast(gt.cast(half, "bf16"), "f32"), half)  # values are real bf16


def test_fp16_overflow_skips_exactly_that_step_and_recovers():
    x_train, y_train, _, _ = digits()
    gt.random.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    scaler = gt.amp.GradScaler(init_scale=2.0**10)
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), gt.optim.AdamW(model.parameters(), lr=1e-3),
                        precision="fp16", scaler=scaler)
    skipped = []
    for i in range(12):
        x, y = x_train[32 * i:32 * i + 32], y_train[32 * i:32 * i + 32]
        if i == 5:
            x = x * np.float32(1e6)  # beyond fp16 range: the half input holds inf
            before = [p.data.copy() for p in model.parameters()]
        out = step(x, y)
        skipped.append(out.skipped)
        if i == 5:
            assert all(np.array_equal(b, p.data) for b, p in zip(before, model.parameters()))
            assert scaler.get_scale() == 2.0**9
    assert skipped == [i == 5 for i in range(12)]
    assert scaler.skipped_steps == 1
    assert np.isfinite(step(x_train[:32], y_train[:32]).loss)


def test_tf32_is_reported_not_applicable_on_the_cpu():
    model = nn.Sequential(nn.Linear(4, 2))
    step = gt.TrainStep(model, nn.MSELoss(), tf32=True)
    try:
        if gt.cuda.device_count() == 0:
            assert step.tf32_status.startswith("not applicable")
            assert gt.info()["tf32"].startswith("not applicable (requested)")
        assert gt.backends.tf32 is True
    finally:
        gt.backends.tf32 = False
    assert "widened exactly to f32" in gt.info()["cpu_half_gemm"]

"""Frozen parameters (requires_grad=False) cost nothing they do not need: no gradient storage, no
weight-gradient work, and a memory plan that shows it to the byte (issue 23, item 2).

The reference of every bit-identity check is the same model with nothing frozen and an optimizer
over the same trainable parameters: both runs execute the same GEMM shapes for what they share
(a frozen layer only skips work), so the trainable parameters and the losses agree bit for bit on
any CPU (the qemu Haswell stage included)."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest

import gputrain as gt
from gputrain import memory_plan as mp
from gputrain import nn
from gputrain.models import from_pretrained
from gputrain.step import pack_for

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "hf")
IDS = np.random.default_rng(0).integers(0, 96, (4, 12))
LABELS = np.roll(IDS, -1, axis=1)  # next tokens (the last wraps around: any label will do)


def load(family, device="cpu"):
    model = from_pretrained(os.path.join(FIXTURES, f"{family}-tiny"))
    return model.to(device) if device != "cpu" else model


def batch_shape(model, family):
    """The shape of a batch of IDS as the model's first layer reads it (a decoder's packed ids)."""
    return pack_for(model, IDS, None, None, None).shape if family == "llama" else IDS.shape


def trainable_names(model, family):
    """The last decoder layer and the final norm train; the rest (embeddings, first layer, head) is frozen."""
    last = ".h.1." if family == "gpt2" else ".layers.1."
    final = ("transformer.ln_f.", "model.norm.")
    return [n for n, _ in model.named_parameters() if last in n or n.startswith(final)]


def freeze_all_but(model, names):
    for name, param in model.named_parameters():
        param.requires_grad_(name in names)


def frozen_numel(model):
    return sum(p.numel() for p in model.parameters() if not p.requires_grad)


def run(family, freeze, *, device="cpu", precision="fp32", steps=2):
    """Two AdamW steps over the trainable parameters of a fixture, the others frozen or not."""
    model = load(family, device)
    names = trainable_names(model, family)
    if freeze:
        freeze_all_but(model, names)
    optimizer = gt.optim.AdamW([p for n, p in model.named_parameters() if n in names], lr=1e-2)
    step = gt.TrainStep(model, gt.nn.CrossEntropyLoss(), optimizer, precision=precision)
    before = {n: p.data.copy() for n, p in model.named_parameters()}
    losses = [step(IDS, LABELS).loss for _ in range(steps)]
    after = {n: p.data.copy() for n, p in model.named_parameters()}
    return model, names, losses, before, after


@pytest.mark.parametrize("device", ["cpu", pytest.param("sim", marks=pytest.mark.sim)])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_trainable_parameters_and_losses_are_bit_identical_and_frozen_ones_untouched(family, precision, device):
    _, names, losses, _, after = run(family, False, device=device, precision=precision)
    model, names_f, losses_f, before_f, after_f = run(family, True, device=device, precision=precision)
    assert names == names_f and losses_f == losses
    for name in names:
        np.testing.assert_array_equal(after_f[name], after[name], err_msg=name)
        assert not np.array_equal(after_f[name], before_f[name]), f"{name} did not train"
    for name, param in model.named_parameters():
        if name not in names:
            np.testing.assert_array_equal(after_f[name], before_f[name], err_msg=name)
            assert param.grad is None, name
        else:
            assert param.grad is not None and param.grad.shape == param.shape, name


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_the_plan_shrinks_by_exactly_the_frozen_gradient_bytes(family):
    model = load(family)
    batch = batch_shape(model, family)
    step = gt.TrainStep(model, gt.nn.CrossEntropyLoss(), precision="bf16")
    full = step.memory_plan(batch)
    full_arenas = model.compiled.arena_plan((batch[0], *batch[1:]), precision="bf16")
    freeze_all_but(model, trainable_names(model, family))
    frozen = frozen_numel(model)
    assert 0 < frozen < model.compiled.num_parameters
    small = step.memory_plan(batch)  # re-planned: the step notices the requires_grad change
    assert full["gradients"] - small["gradients"] == 4 * frozen
    assert small["gradients"] == 4 * model.compiled.num_gradients
    assert full["total"] - small["total"] == 4 * frozen
    assert {k: v for k, v in small.items() if k not in ("gradients", "total")} == \
           {k: v for k, v in full.items() if k not in ("gradients", "total")}
    arenas = model.compiled.arena_plan((batch[0], *batch[1:]), precision="bf16")
    assert arenas["gradients"] < full_arenas["gradients"]
    assert arenas["parameters"] == full_arenas["parameters"]  # the f32 master copy stays (see the report)
    assert model.compiled.live_arenas()["gradients"] == arenas["gradients"]
    for param in model.parameters():  # unfreezing plans them all again
        param.requires_grad_(True)
    assert step.memory_plan(batch) == full


@pytest.mark.sim
@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_a_sim_run_with_a_frozen_base_peaks_at_its_plan(precision):
    """tests/test_memory_plan.py's sim check, with most of a Llama frozen: the device pool's peak
    over a step is the step's plan, to the byte (the smaller gradient arena included)."""
    model = load("llama", "sim")
    names = trainable_names(model, "llama")
    freeze_all_but(model, names)
    optimizer = gt.optim.AdamW([p for n, p in model.named_parameters() if n in names], lr=1e-2)
    step = gt.TrainStep(model, gt.nn.CrossEntropyLoss(), optimizer, precision=precision)
    batch = batch_shape(model, "llama")
    gc.collect()
    gc.disable()
    try:
        gt.reset_peak_memory_stats("sim:0")
        plan = mp.plan_step(step, batch)
        step(IDS, LABELS)
        peak = gt.memory_stats("sim:0")["peak_reserved_bytes"]
    finally:
        gc.enable()
    assert plan["sim:0"]["gradients"] < plan["sim:0"]["parameters"]
    assert peak == plan.total("sim:0"), str(plan)


@pytest.mark.parametrize("device", ["cpu", pytest.param("sim", marks=pytest.mark.sim)])
def test_freeze_step_unfreeze_step_matches_a_run_that_adds_the_parameters_later(device):
    """freeze -> step -> unfreeze -> step re-plans twice and computes what a run without freezing
    computes when the later parameters join the optimizer after its first step."""
    results = []
    for freeze in (True, False):
        model = load("llama", device)
        names = trainable_names(model, "llama")
        later = [p for n, p in model.named_parameters() if n not in names]
        if freeze:
            freeze_all_but(model, names)
        optimizer = gt.optim.AdamW([p for n, p in model.named_parameters() if n in names], lr=1e-2)
        step = gt.TrainStep(model, gt.nn.CrossEntropyLoss(), optimizer, precision="bf16")
        first = step(IDS, LABELS).loss
        assert model.compiled.num_gradients == (sum(p.numel() for n, p in model.named_parameters() if n in names)
                                                if freeze else model.compiled.num_parameters)
        for param in later:
            param.requires_grad_(True)
        optimizer.add_param_group({"params": later})
        second = step(IDS, LABELS).loss
        assert model.compiled.num_gradients == model.compiled.num_parameters
        assert all(p.grad is not None for p in model.parameters())
        results.append((first, second, {n: p.data.copy() for n, p in model.named_parameters()}))
    (first, second, params), (first_ref, second_ref, params_ref) = results
    assert (first, second) == (first_ref, second_ref)
    for name, values in params_ref.items():
        np.testing.assert_array_equal(params[name], values, err_msg=name)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("device", ["cpu", pytest.param("sim", marks=pytest.mark.sim)])
def test_bitfit_freezes_every_weight_and_trains_the_biases(device, precision):
    """GPT-2 with only its biases trainable (BitFit): LayerNorm computes its bias gradient alone,
    Linear its bias and input gradients only; same bits as the unfrozen run over the biases. In
    bf16 the step refreshes the half copy of the trainable parameters only (scattered here: one
    bias at a time between frozen weights), so the later steps' losses would show a stale one."""
    results = []
    for freeze in (True, False):
        model = load("gpt2", device)
        biases = [n for n, _ in model.named_parameters() if n.endswith(".bias")]
        if freeze:
            freeze_all_but(model, biases)
        optimizer = gt.optim.AdamW([p for n, p in model.named_parameters() if n in biases], lr=1e-2)
        step = gt.TrainStep(model, gt.nn.CrossEntropyLoss(), optimizer, precision=precision)
        losses = [step(IDS, LABELS).loss for _ in range(3)]
        results.append((losses, {n: p.data.copy() for n, p in model.named_parameters()}))
        if freeze:
            assert model.compiled.num_gradients == sum(p.numel() for n, p in model.named_parameters() if n in biases)
    (losses, params), (losses_ref, params_ref) = results
    assert losses == losses_ref
    for name, values in params_ref.items():
        np.testing.assert_array_equal(params[name], values, err_msg=name)


def param(model, name):
    return dict(model.named_parameters())[name]


def small_classifier():
    gt.random.manual_seed(0)
    return nn.Sequential(nn.Embedding(20, 8), nn.LayerNorm(8), nn.Linear(8, 8), nn.RMSNorm(8), nn.Linear(8, 5))


@pytest.mark.parametrize("device", ["cpu", pytest.param("sim", marks=pytest.mark.sim)])
def test_a_frozen_embedding_and_its_neighbours_get_no_gradient_and_the_rest_matches(device):
    ids = np.random.default_rng(1).integers(0, 20, (6,))
    labels = np.random.default_rng(2).integers(0, 5, (6,))
    results = []
    for freeze in (True, False):
        model = small_classifier()
        model = model.to(device) if device != "cpu" else model
        # all frozen but LayerNorm's bias and the head: input gradients flow through the frozen rest
        frozen = ("0.weight", "1.weight", "2.weight", "2.bias", "3.weight")
        if freeze:
            for name in frozen:
                param(model, name).requires_grad_(False)
        trained = ["1.bias", "4.weight", "4.bias"]
        optimizer = gt.optim.SGD([p for n, p in model.named_parameters() if n in trained], lr=0.1)
        step = gt.TrainStep(model, gt.nn.CrossEntropyLoss(), optimizer)
        losses = [step(ids, labels).loss for _ in range(3)]
        grads = {n: None if p.grad is None else p.grad.copy() for n, p in model.named_parameters()}
        results.append((losses, grads, {n: p.data.copy() for n, p in model.named_parameters()}))
    (losses, grads, params), (losses_ref, grads_ref, params_ref) = results
    assert losses == losses_ref
    for name in ("0.weight", "1.weight", "2.weight", "2.bias", "3.weight"):
        assert grads[name] is None and grads_ref[name] is not None
        np.testing.assert_array_equal(params[name], params_ref[name])
    for name in ("1.bias", "4.weight", "4.bias"):
        np.testing.assert_array_equal(grads[name], grads_ref[name], err_msg=name)
        np.testing.assert_array_equal(params[name], params_ref[name], err_msg=name)


def test_a_layer_that_cannot_skip_its_gradient_is_refused_by_name_and_nothing_changes():
    gt.random.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(8, 3))
    x = np.random.default_rng(0).standard_normal((2, 1, 4, 4)).astype(np.float32)
    y = np.array([0, 2])
    step = gt.TrainStep(model, gt.nn.CrossEntropyLoss(), gt.optim.SGD(model.parameters(), lr=0.1))
    step(x, y)
    plan = step.memory_plan(x.shape)
    grad = param(model, "0.weight").grad.copy()
    weight = param(model, "0.weight")
    weight.requires_grad_(False)
    with pytest.raises(ValueError, match=r"0\.weight: requires_grad=False, but a Conv2d layer cannot skip"):
        step(x, y)
    with pytest.raises(ValueError, match=r"0\.weight"):
        step.memory_plan(x.shape)
    assert model.compiled.num_gradients == model.compiled.num_parameters
    np.testing.assert_array_equal(weight.grad, grad)  # the gradient arena was not touched
    weight.requires_grad_(True)
    assert step.memory_plan(x.shape) == plan
    step(x, y)
    # the Linear after it can be frozen alone
    param(model, "2.weight").requires_grad_(False)
    step(x, y)
    assert param(model, "2.weight").grad is None
    with pytest.raises(ValueError, match="frozen: expected 4 flags"):
        model.compiled.set_frozen([True])


def test_gradient_arrays_taken_before_a_re_plan_stay_readable():
    """A NumPy view of the gradients kept across a change of the frozen parameters still reads
    the (retired) arena it viewed, which lives until the view dies (run under ASan by CI)."""
    model = small_classifier()
    ids = np.arange(6) % 20
    labels = np.arange(6) % 5
    step = gt.TrainStep(model, gt.nn.CrossEntropyLoss(), gt.optim.SGD(model.parameters(), lr=0.1))
    step(ids, labels)
    kept = param(model, "4.weight").grad
    copy = kept.copy()
    param(model, "0.weight").requires_grad_(False)
    step.memory_plan(ids.shape)  # re-plans: the gradients that stay are kept, at their new place
    assert param(model, "0.weight").grad is None
    np.testing.assert_array_equal(param(model, "4.weight").grad, copy)
    assert param(model, "4.weight").grad is not kept
    step(ids, labels)
    np.testing.assert_array_equal(kept, copy)  # the old arena, not the new one
    assert not np.array_equal(param(model, "4.weight").grad, copy)
    with pytest.raises(RuntimeError, match="frozen"):
        param(model, "0.weight").grad = np.zeros((20, 8), np.float32)
    del kept
    gc.collect()


@pytest.mark.sim
def test_a_sim_trainer_run_with_a_frozen_base_peaks_at_its_plan(tmp_path):
    """The Trainer's plan (what its start-up block prints) of a GPT-2 whose base is frozen is the
    device pool's peak, and its start-up block counts the frozen parameters."""
    model = load("gpt2", "sim")
    freeze_all_but(model, trainable_names(model, "gpt2"))
    x, y = np.repeat(IDS, 3, axis=0), np.repeat(LABELS, 3, axis=0)
    args = gt.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=6, learning_rate=1e-3,
                                save_strategy="no", logging_steps=50, disable_tqdm=True, seed=3, device="sim",
                                max_steps=2, bf16=True)
    gc.collect()
    trainer = gt.Trainer(model, args, train_dataset=(x, y))
    gt.reset_peak_memory_stats("sim:0")  # after the model's first gradient arena (all trainable) was replaced
    plan = trainer.memory_plan()
    frozen = frozen_numel(model)
    assert f"({frozen:,} frozen: no gradient)" in trainer._startup_block()
    assert plan["sim:0"]["gradients"] == model.compiled.arena_plan(x[:6].shape, precision="bf16")["gradients"]
    before = {n: p.data.copy() for n, p in model.named_parameters() if not p.requires_grad}
    trainer.train()
    assert trainer.state.global_step == 2
    assert gt.memory_stats("sim:0")["peak_reserved_bytes"] == plan.total("sim:0"), str(plan)
    for name, param in model.named_parameters():
        if name in before:
            np.testing.assert_array_equal(param.data, before[name], err_msg=name)


@pytest.mark.parametrize("device", ["cpu", pytest.param("sim", marks=pytest.mark.sim)])
def test_a_frozen_table_shared_with_the_lm_head_is_frozen_in_both_uses(device):
    """tie_word_embeddings: the token table is also the head's weight; frozen, neither use computes
    its gradient (the head its input gradient only), and the rest trains as without freezing."""
    from gputrain.models.hf import decoder_models as dm

    config = {"model_type": "llama", "vocab_size": 96, "hidden_size": 32, "intermediate_size": 48,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "tie_word_embeddings": True}
    results = []
    for freeze in (True, False):
        gt.random.manual_seed(0)
        model = dm.LlamaForCausalLM(config)
        model = model.to(device) if device != "cpu" else model
        names = [n for n, _ in model.named_parameters()]
        assert "lm_head.weight" not in names  # one parameter, two uses
        table = param(model, "model.embed_tokens.weight")
        if freeze:
            table.requires_grad_(False)
        optimizer = gt.optim.AdamW([p for n, p in model.named_parameters() if n != "model.embed_tokens.weight"],
                                   lr=1e-2)
        step = gt.TrainStep(model, gt.nn.CrossEntropyLoss(), optimizer)
        losses = [step(IDS, LABELS).loss for _ in range(2)]
        if freeze:
            assert table.grad is None
            assert model.compiled.num_gradients == model.compiled.num_parameters - table.numel()
        results.append((losses, {n: p.data.copy() for n, p in model.named_parameters()}))
    (losses, params), (losses_ref, params_ref) = results
    assert losses == losses_ref
    for name, values in params_ref.items():
        np.testing.assert_array_equal(params[name], values, err_msg=name)


@pytest.mark.sim
def test_zero_stage_1_refuses_a_model_with_frozen_parameters():
    """ZeRO-1 cuts the gradient arena as the parameter arena: with frozen parameters they differ,
    so a device optimizer's shard is refused by name (and built without them frozen)."""
    model = small_classifier().to("sim")
    step = gt.TrainStep(model, gt.nn.CrossEntropyLoss())
    n = len(list(model.parameters()))
    make = lambda: gt._C.ModelOptimizer("adamw", model.compiled, list(range(n)), [0] * n, [{"lr": 0.1}],  # noqa: E731
                                        [p.requires_grad for p in model.parameters()], zero_size=2, zero_rank=0)
    make()
    param(model, "0.weight").requires_grad_(False)
    step.memory_plan((6,))
    with pytest.raises(ValueError, match="zero_stage=1: the model has frozen parameters"):
        make()


@pytest.mark.parametrize("backend", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("op", ["layernorm", "rmsnorm"])
def test_norm_backward_ops_skip_a_frozen_weight(backend, op):
    """A NULL dweight (a frozen weight): the same input gradient (and LayerNorm's bias gradient,
    alone) as with it, on each backend's own table."""
    from gputrain import _C_testing

    rng = np.random.default_rng(7)
    rows, cols = 37, 45
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    dout = rng.standard_normal((rows, cols)).astype(np.float32)
    weight, bias = rng.standard_normal(cols).astype(np.float32), rng.standard_normal(cols).astype(np.float32)
    rstd, mean = np.zeros(rows, np.float32), np.zeros(rows, np.float32)
    if op == "layernorm":
        _C_testing.run_op(backend, "layernorm_forward", [np.empty_like(x), mean, rstd, x, weight, bias],
                          (rows, cols, 1e-5, "f32"))
        run = lambda dweight, dbias, din: _C_testing.run_op(  # noqa: E731
            backend, "layernorm_backward", [din, dweight, dbias, dout, x, weight, mean, rstd],
            (rows, cols, "f32", False))
    else:
        _C_testing.run_op(backend, "rmsnorm_forward", [np.empty_like(x), rstd, x, weight], (rows, cols, 1e-6, "f32", 0))
        run = lambda dweight, dbias, din: _C_testing.run_op(  # noqa: E731
            backend, "rmsnorm_backward", [din, dweight, dout, x, weight, rstd], (rows, cols, "f32", False, 0))
    din, dweight, dbias = np.zeros_like(x), np.zeros(cols, np.float32), np.zeros(cols, np.float32)
    run(dweight, dbias, din)
    din_frozen, dbias_frozen = np.zeros_like(x), np.zeros(cols, np.float32)
    run(None, dbias_frozen, din_frozen)
    np.testing.assert_array_equal(din_frozen, din)
    assert np.any(dweight != 0)
    if op == "layernorm":
        np.testing.assert_array_equal(dbias_frozen, dbias)
        din_both = np.zeros_like(x)
        run(None, None, din_both)  # weight and bias frozen: the input gradient alone
        np.testing.assert_array_equal(din_both, din)

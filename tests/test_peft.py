"""gputrain.peft (LoRA) against PEFT: the fixtures of tests/fixtures/make_peft_fixtures.py (an adapter
made by PEFT 0.21 on the tiny Llama with biases, init_lora_weights=False so B is not zero, rsLoRA, and
PEFT's float32 logits, loss, adapter gradients and merged logits). fp32 logits within 1e-5 and
gradients within 1e-4 (relative); PEFT's files both ways; merge_and_unload; a short training run
that moves only the adapter; the C kind against a float64 NumPy reference (dropout included); bad
inputs refused with nothing applied."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import safetensors.numpy

import gputrain as gt
from gputrain.models import from_pretrained
from gputrain.peft import LoraConfig, LoraLinear, PeftModel, get_peft_model

from _peft_helpers import (ADAPTER, BASE, DORA, LORA, assert_peft_s_loss_and_gradients, assert_trainer_fine_tunes,
                           assert_training_moves_only_the_adapter, assert_unchanged, grad_keys, internal_name,
                           lora_reference, relative_error, snapshot, training_case)


@pytest.fixture(scope="module")
def ref():
    return np.load(LORA + ".npz")


@pytest.fixture(scope="module", params=["lora", "dora"])
def adapter(request):
    """(folder, reference) of PEFT's LoRA and DoRA adapters."""
    folder = LORA if request.param == "lora" else DORA
    return folder, np.load(folder + ".npz")


def adapted_logits(model, ref):
    return model(ref["input_ids"], attention_mask=ref["attention_mask"])


def real(ref):
    return ref["attention_mask"].astype(bool)


def test_logits_match_peft(adapter):
    folder, ref = adapter
    model = PeftModel.from_pretrained(from_pretrained(BASE), folder)
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    logits = adapted_logits(model, ref)
    assert relative_error(logits[real(ref)], ref["logits"][real(ref)]) <= 1e-5
    base = from_pretrained(BASE)(ref["input_ids"], attention_mask=ref["attention_mask"])
    assert relative_error(base[real(ref)], ref["logits"][real(ref)]) > 1e-2  # the adapter matters


def test_loss_and_adapter_gradients_match_peft(adapter):
    folder, ref = adapter
    model = PeftModel.from_pretrained(from_pretrained(BASE), folder, is_trainable=True)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    keys = grad_keys(ref)
    assert trainable == {internal_name(k) for k in keys} and len(keys) == (28 if folder == LORA else 18)
    assert_peft_s_loss_and_gradients(model, ref)


def test_saved_adapter_is_peft_s_files(tmp_path, adapter):
    folder, ref = adapter
    model = PeftModel.from_pretrained(from_pretrained(BASE), folder, is_trainable=True)
    model.save_pretrained(tmp_path)
    ours = safetensors.numpy.load_file(str(tmp_path / "adapter_model.safetensors"))
    theirs = safetensors.numpy.load_file(os.path.join(folder, "adapter_model.safetensors"))
    assert sorted(ours) == sorted(theirs)
    for key in theirs:
        assert ours[key].dtype == np.float32 and np.array_equal(ours[key], theirs[key]), key
    with open(tmp_path / "adapter_config.json") as f:
        config = json.load(f)
    with open(os.path.join(folder, "adapter_config.json")) as f:
        peft_config = json.load(f)
    assert set(config) == set(peft_config) - {"peft_version"}  # gputrain claims no PEFT version
    for field in ("r", "lora_alpha", "lora_dropout", "use_rslora", "use_dora", "bias", "peft_type", "inference_mode"):
        assert config[field] == peft_config[field], field
    assert sorted(config["target_modules"]) == sorted(peft_config["target_modules"])
    again = PeftModel.from_pretrained(from_pretrained(BASE), tmp_path)
    assert np.array_equal(adapted_logits(again, ref), adapted_logits(model.eval(), ref))


def test_merge_and_unload(adapter):
    folder, ref = adapter
    model = PeftModel.from_pretrained(from_pretrained(BASE), folder)
    adapted = adapted_logits(model, ref)
    merged = model.merge_and_unload()
    assert not any(isinstance(m, LoraLinear) for m in merged.modules())
    assert "model.layers.0.self_attn.q_proj.weight" in merged.state_dict()
    logits = merged(ref["input_ids"], attention_mask=ref["attention_mask"])
    assert relative_error(logits[real(ref)], adapted[real(ref)]) <= 1e-5
    assert relative_error(logits[real(ref)], ref["merged_logits"][real(ref)]) <= 1e-5


def test_training_moves_only_the_adapter(ref):
    gt.random.manual_seed(3)
    model = get_peft_model(from_pretrained(BASE), LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1,
                                                             target_modules="all-linear"))
    assert_training_moves_only_the_adapter(model, ref)


def test_all_linear_targets_peft_s_set():
    model = get_peft_model(from_pretrained(BASE), LoraConfig(r=2, target_modules="all-linear"))
    expected = {f"model.layers.{i}.{part}" for i in range(2) for part in
                ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                 "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}
    assert {name for name, _ in model.lora_layers()} == expected  # PEFT 0.21's choice on this model: no lm_head
    assert set(model.peft_config["default"].target_modules) == expected


def test_print_trainable_parameters_is_peft_s_text(capsys):
    model = get_peft_model(from_pretrained(BASE), LoraConfig(r=2, target_modules=["q_proj"], modules_to_save=["lm_head"]))
    model.print_trainable_parameters()
    # PEFT 0.21.2 printed this for the same config on the same model
    assert capsys.readouterr().out == "trainable params: 6,784 || all params: 81,728 || trainable%: 8.3007\n"
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    assert "base_model.model.lm_head.weight" in names


def test_modules_to_save_round_trip(tmp_path, ref):
    model = get_peft_model(from_pretrained(BASE), LoraConfig(r=2, target_modules=["q_proj"], modules_to_save=["lm_head"],
                                                             init_lora_weights=False))
    head = model.get_submodule("base_model.model.lm_head")
    head.weight.data = head.weight.data * 1.5
    model.save_pretrained(tmp_path)
    keys = set(safetensors.numpy.load_file(str(tmp_path / "adapter_model.safetensors")))
    assert "base_model.model.lm_head.weight" in keys and len(keys) == 5
    again = PeftModel.from_pretrained(from_pretrained(BASE), tmp_path)
    assert np.array_equal(adapted_logits(again, ref), adapted_logits(model.eval(), ref))


# -- the C kind alone against float64 NumPy ----------------------------------------------------
def dora_reference(x, w, b, a, bb, m, s, dy, mask=None):
    """PEFT's DoRA (weight norm a constant) and its gradients for upstream dy (float64): y, dB, dA, dx, dm."""
    keep = np.ones_like(x) if mask is None else mask
    xd = x * keep
    h = xd @ a.T
    u, v = xd @ w.T, h @ bb.T
    n = np.linalg.norm(w + s * bb @ a, axis=1)
    g = m / n
    y = x @ w.T + b + (g - 1) * u + g * v * s
    dm = (dy * (u + s * v)).sum(0) / n
    dh = s * (g * dy) @ bb
    dx = dy @ w + keep * (((g - 1) * dy) @ w + dh @ a)
    return y, s * (g * dy).T @ h, dh.T @ xd, dx, dm


def small_model(p=0.0, scaling=0.75, use_dora=False):
    gt.random.manual_seed(11)
    base = gt.nn.Linear(6, 5)
    lora = LoraLinear(base, r=3, lora_alpha=scaling * 3, lora_dropout=p, init_lora_weights=False, use_dora=use_dora)
    if use_dora:  # a magnitude away from its starting norms, so m / n is not 1
        lora.lora_magnitude_vector.default.weight.data = np.linspace(0.5, 2.0, 5, dtype=np.float32)
    return gt.nn.Sequential(gt.nn.Linear(4, 6), lora), lora


def numpy_params(lora):
    get = lambda p: p.data.astype(np.float64)
    return (get(lora.base_layer.weight), get(lora.base_layer.bias), get(lora.lora_A.default.weight),
            get(lora.lora_B.default.weight))


@pytest.mark.parametrize("p", [0.0, 0.5])
@pytest.mark.parametrize("device", ["cpu", "sim"])
def test_dora_kind_matches_numpy(p, device):
    """DoRA's forward and gradients (MSE loss) in training, the dropout mask as in the LoRA test below."""
    model, lora = small_model(p, use_dora=True)
    model._compile(device, seed=99)
    x, target, hidden, mask = training_case(model, p)
    w, b, a, bb = numpy_params(lora)
    m = lora.lora_magnitude_vector.default.weight.data.astype(np.float64)
    y, *_ = dora_reference(hidden, w, b, a, bb, m, 0.75, np.zeros((7, 5)), mask)
    assert np.allclose(model(x), y, rtol=1e-5, atol=1e-6)
    gt.TrainStep(model, gt.nn.MSELoss())(x, target.astype(np.float32))
    dy = 2.0 * (y - target) / y.size
    _, dB, dA, dx, dm = dora_reference(hidden, w, b, a, bb, m, 0.75, dy, mask)
    params = dict(model.named_parameters())
    assert relative_error(params["1.lora_B.default.weight"].grad, dB) <= 1e-5
    assert relative_error(params["1.lora_A.default.weight"].grad, dA) <= 1e-5
    assert relative_error(params["1.lora_magnitude_vector.default.weight"].grad, dm) <= 1e-5
    assert relative_error(params["0.weight"].grad, dx.T @ x) <= 1e-5


@pytest.mark.parametrize("device", ["cpu", "sim"])
def test_kind_matches_numpy(device):
    model, lora = small_model()
    model.to(device)
    x = np.random.default_rng(0).normal(size=(7, 4)).astype(np.float32)
    hidden = x.astype(np.float64) @ model[0].weight.data.T.astype(np.float64) + model[0].bias.data
    w, b, a, bb = numpy_params(lora)
    y, *_ = lora_reference(hidden, w, b, a, bb, 0.75, np.zeros((7, 5)))
    assert np.allclose(model(x), y, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("p", [0.0, 0.5])
def test_kind_dropout_and_gradients_match_numpy(p):
    """Forward and the adapter's gradients (MSE loss) in training, the dropout mask from a probe
    Dropout layer (training_case)."""
    model, lora = small_model(p)
    model._compile("cpu", seed=99)
    x, target, hidden, mask = training_case(model, p)
    w, b, a, bb = numpy_params(lora)
    if p:
        assert 0 < mask.mean() < 2  # some kept, some dropped
    y, *_ = lora_reference(hidden, w, b, a, bb, 0.75, np.zeros((7, 5)), mask)
    assert np.allclose(model(x), y, rtol=1e-5, atol=1e-6)
    gt.TrainStep(model, gt.nn.MSELoss())(x, target.astype(np.float32))
    dy = 2.0 * (y - target) / y.size
    _, dB, dA, dx = lora_reference(hidden, w, b, a, bb, 0.75, dy, mask)
    assert relative_error(lora.lora_B.default.weight.grad, dB) <= 1e-5
    assert relative_error(lora.lora_A.default.weight.grad, dA) <= 1e-5
    assert relative_error(model[0].weight.grad, dx.T @ x) <= 1e-5  # the input gradient, through the layer below


def test_same_on_sim_and_with_checkpointing(adapter):
    """The sim device runs the CPU ops (the DoRA ops included) on its streams: the same bits."""
    folder, ref = adapter
    cpu = PeftModel.from_pretrained(from_pretrained(BASE), folder, is_trainable=True)
    labels = cpu.shift_labels(ref["labels"])
    gt.TrainStep(cpu, gt.nn.CrossEntropyLoss())(ref["input_ids"], labels, attention_mask=ref["attention_mask"])
    grads = {n: p.grad.copy() for n, p in cpu.named_parameters() if p.requires_grad}
    for device, checkpointing in (("sim", False), ("cpu", True)):
        model = PeftModel.from_pretrained(from_pretrained(BASE), folder, is_trainable=True).to(device)
        gt.TrainStep(model, gt.nn.CrossEntropyLoss(), gradient_checkpointing=checkpointing)(
            ref["input_ids"], labels, attention_mask=ref["attention_mask"])
        for name, p in model.named_parameters():
            if p.requires_grad:
                assert np.array_equal(p.grad, grads[name]), (device, name)


def test_bf16_close_to_fp32(ref):
    model = PeftModel.from_pretrained(from_pretrained(BASE), LORA, is_trainable=True)
    labels = model.shift_labels(ref["labels"])
    out = gt.TrainStep(model, gt.nn.CrossEntropyLoss(), precision="bf16")(ref["input_ids"], labels,
                                                                           attention_mask=ref["attention_mask"])
    assert out.loss == pytest.approx(float(ref["loss"]), rel=2e-2)
    key = "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"
    assert relative_error(dict(model.named_parameters())[internal_name(key)].grad, ref[f"grad/{key}"]) <= 5e-2


# -- bad input: clear exceptions, nothing applied ---------------------------------------------
@pytest.mark.parametrize("targets", [["q_projection", "nothing"], "model\\.layers\\.9\\..*"])
def test_targets_matching_nothing_are_named(targets):
    model = from_pretrained(BASE)
    before = snapshot(model)
    with pytest.raises(ValueError, match="matched no module") as info:
        get_peft_model(model, LoraConfig(target_modules=targets))
    assert repr(targets) in str(info.value)
    assert_unchanged(model, before)
    model(np.array([[1, 2, 3]]))  # still runs as it was


def test_target_that_is_not_a_linear_is_refused():
    model = from_pretrained(BASE)
    before = snapshot(model)
    with pytest.raises(ValueError, match="'model.norm' is a RMSNorm"):
        get_peft_model(model, LoraConfig(target_modules=["q_proj", "norm"]))
    assert_unchanged(model, before)


@pytest.mark.parametrize("r", [0, -2])
def test_rank_must_be_positive(r):
    with pytest.raises(ValueError, match="r must be a positive int"):
        LoraConfig(r=r)
    with pytest.raises(TypeError, match="r must be an int"):
        LoraConfig(r=2.0)
    with pytest.raises(ValueError, match="lora_dropout"):
        LoraConfig(lora_dropout=1.0)


def test_adapter_for_another_base_names_the_key(tmp_path):
    folder = tmp_path / "adapter"
    shutil.copytree(LORA, folder)
    tensors = safetensors.numpy.load_file(str(folder / "adapter_model.safetensors"))
    key = "base_model.model.model.layers.1.mlp.up_proj.lora_A.weight"
    tensors[key] = np.zeros((4, 48), np.float32)  # a base with hidden size 48
    safetensors.numpy.save_file(tensors, str(folder / "adapter_model.safetensors"))
    model = from_pretrained(BASE)
    before = snapshot(model)
    with pytest.raises(ValueError, match=f"tensor '{key}' has shape \\(4, 48\\), but this model needs \\(4, 64\\)"):
        PeftModel.from_pretrained(model, folder)
    assert_unchanged(model, before)
    del tensors[key]
    safetensors.numpy.save_file(tensors, str(folder / "adapter_model.safetensors"))
    with pytest.raises(ValueError, match="misses 1 tensors"):
        PeftModel.from_pretrained(model, folder)
    with open(folder / "adapter_config.json") as f:
        config = json.load(f)
    with open(folder / "adapter_config.json", "w") as f:
        json.dump({**config, "fan_in_fan_out": True}, f)
    with pytest.raises(ValueError, match="fan_in_fan_out=True is not implemented"):
        PeftModel.from_pretrained(model, folder)
    assert_unchanged(model, before)


def test_trainable_base_weight_is_refused_by_name(ref):
    model = get_peft_model(from_pretrained(BASE), LoraConfig(r=2, target_modules=["v_proj"]))
    name = "base_model.model.model.layers.0.self_attn.v_proj.base_layer.weight"
    dict(model.named_parameters())[name].requires_grad = True
    with pytest.raises(ValueError, match=name.replace(".", "\\.") + ": the base layer of a LoRA Linear is frozen"):
        gt.TrainStep(model, gt.nn.CrossEntropyLoss())


def test_a_model_that_cannot_compile_is_left_as_it_was(monkeypatch):
    model = from_pretrained(BASE)
    before = snapshot(model)

    def refuse(*args, **kwargs):
        raise MemoryError("out of memory (test)")

    monkeypatch.setattr(PeftModel, "_compile", refuse)
    with pytest.raises(MemoryError):
        get_peft_model(model, LoraConfig(r=2, target_modules="all-linear", use_dora=True))
    assert_unchanged(model, before)
    assert all(p.requires_grad for p in model.parameters())
    model(np.array([[1, 2, 3]]))



@pytest.mark.native_only  # a Trainer run end to end: its kernels run under qemu in the quicker tests
def test_trainer_fine_tunes_a_dora_adapter(tmp_path):
    """Trainer(model=get_peft_model(...)): the loss falls and only the adapter (A, B, m) moves."""
    gt.random.manual_seed(0)
    model = get_peft_model(from_pretrained(BASE), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                             use_dora=True))
    assert_trainer_fine_tunes(model, tmp_path, ADAPTER + (".lora_magnitude_vector.",))


def test_an_encoder_s_adapter_is_in_the_model_it_runs():
    """The encoders hold each projection twice (the attribute their spec reads and the tree their
    names come from): an adapter put only in the tree was never run. Now it runs, and merging it
    gives the adapted logits."""
    folder = os.path.join(os.path.dirname(BASE), "bert-seqcls-tiny")
    ids = np.random.default_rng(0).integers(0, 90, (2, 7))
    base = from_pretrained(folder)
    base.eval()
    plain = base(ids)
    gt.random.manual_seed(1)
    peft = get_peft_model(base, LoraConfig(r=4, target_modules=["query", "value", "dense"]))
    for _, lora in peft.lora_layers():
        b = lora.lora_B.default.weight
        b.data = np.random.default_rng(2).standard_normal(b.data.shape).astype(np.float32) * 0.1
    peft.eval()
    adapted = peft(ids)
    assert np.abs(adapted - plain).max() > 1e-3
    merged = peft.merge_and_unload()
    merged.eval()
    assert np.abs(merged(ids) - adapted).max() <= 1e-5 * np.abs(adapted).max() + 1e-6

"""A 4-bit weight's absmax held double-quantized (QLoRA's double quantization, bitsandbytes'
compress_statistics / bnb_4bit_use_double_quant): QLinear(..., double_quant=True).

The layer keeps the absmax as bitsandbytes does -- uint8 codes of absmax - offset in blocks of 256
with the signed dynamic map, a float32 absmax per such block and the float32 offset, about an
eighth of the float32 absmax -- and dequantizes each tile's absmax as bitsandbytes computes it, so
it gives the bits of a QLinear holding that absmax expanded to float32 (which tests/test_qlinear.py
checks against bitsandbytes' own dequantization).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import gputrain as gt
from gputrain import nn
from gputrain.models import from_pretrained
from gputrain.models.hf.quantized import read_raw
from gputrain.models.hf.safetensors_io import checkpoint_tensors
from gputrain.peft import LoraConfig, get_peft_model

import _reference as ref
from _peft_helpers import BASE, adapted_with_acting_b
from _sim_steps import assert_sim_gives_the_cpu_bits_at_its_plan

HF = os.path.join(os.path.dirname(__file__), "fixtures", "hf")


def aligned(n: int) -> int:
    return -(-n // 64) * 64


def pair(out: int, inp: int, quant_type: str, blocksize: int, tile_rows: int = 0):
    """(a double_quant QLinear, a QLinear holding its absmax expanded to float32), same codes and bias."""
    w = (np.random.default_rng(out).standard_normal((out, inp)) * 0.05).astype(np.float32)
    double = nn.QLinear(inp, out, True, quant_type, blocksize, tile_rows, double_quant=True).quantize_(w)
    expanded = nn.QLinear(inp, out, True, quant_type, blocksize, tile_rows)
    expanded.load_quantized(np.asarray(double.weight), double.quant_state())
    bias = np.linspace(-0.5, 0.5, out, dtype=np.float32)
    for layer in (double, expanded):
        layer.load_state_dict({"bias": bias}, strict=False)
    return double, expanded


def forward_and_input_gradient(layer, x: np.ndarray, device: str, precision: str):
    """(outputs, d loss / d x) of an MSE on layer(x), the input gradient read as the weight gradient
    of an identity Linear in front."""
    eye = nn.Linear(x.shape[1], x.shape[1], bias=False)
    eye.load_state_dict({"weight": np.eye(x.shape[1], dtype=np.float32)})
    model = nn.Sequential(eye, layer).to(device)
    model.compiled.precision = precision
    out = np.asarray(model(x))
    step = gt.TrainStep(model, nn.MSELoss(), precision={"f32": "fp32"}.get(precision, precision))
    step(x, np.zeros_like(out))
    return out, model[0].weight.grad.copy()


@pytest.mark.parametrize("device", ["cpu", pytest.param("sim", marks=pytest.mark.sim)])
@pytest.mark.parametrize("precision", ["f32", "bf16"])
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("shape", [(40, 64, 64, 0), (300, 96, 32, 0), (700, 128, 64, 384), (513, 64, 64, 0)],
                         ids=["one-nested-block", "partial-blocks", "tiles", "ragged"])
def test_the_layer_gives_the_bits_of_its_absmax_expanded_to_float32(device, precision, quant_type, shape):
    """(With the same tiles: a double-quantized layer's start on a block of the absmax, 256 blocks,
    and the tiles' input gradients are summed in order, so another tiling sums otherwise.)"""
    out, inp, blocksize, tile_rows = shape
    double, expanded = pair(out, inp, quant_type, blocksize, tile_rows)
    x = np.random.default_rng(1).standard_normal((7, inp)).astype(np.float32)
    got, want = (forward_and_input_gradient(layer, x, device, precision) for layer in (double, expanded))
    assert ref.same_bits(got[0], want[0]) and ref.same_bits(got[1], want[1])


def test_it_holds_bitsandbytes_nested_state_and_an_eighth_of_the_absmax_bytes():
    out, inp = 700, 128
    w = (np.random.default_rng(2).standard_normal((out, inp)) * 0.05).astype(np.float32)
    double = nn.QLinear(inp, out, False, "nf4", 64, double_quant=True).quantize_(w)
    packed, state = gt.quant.quantize_4bit(w, 64, "nf4", compress_statistics=True)
    held = double.state_dict()
    assert np.array_equal(held["weight"], packed)
    assert held["weight.absmax"].dtype == np.uint8 and np.array_equal(held["weight.absmax"], state.absmax)
    assert ref.same_bits(held["weight.nested_absmax"], np.asarray(state.nested_absmax, np.float32))
    assert ref.same_bits(held["weight.offset"], np.array([state.offset], np.float32))
    assert ref.same_bits(double.dequantize(), gt.quant.dequantize_4bit(packed, state))
    blocks = out * inp // 64
    plain = nn.QLinear(inp, out, False, "nf4", 64)
    got = gt.TrainStep(double, nn.MSELoss(), precision="bf16").memory_plan((4, inp))["buffers"]
    want = gt.TrainStep(plain, nn.MSELoss(), precision="bf16").memory_plan((4, inp))["buffers"]
    assert want - got == aligned(4 * blocks) - (aligned(blocks) + aligned(4 * -(-blocks // 256)) + aligned(4))


def test_bad_input_is_refused_naming_it_with_nothing_changed():
    with pytest.raises(ValueError, match="double_quant=True compresses a 4-bit weight's absmax"):
        nn.QLinear(64, 8, quant_type="int8", double_quant=True)
    with pytest.raises(ValueError, match="int8 and half weights have none to compress"):
        gt._C.Model([("qlinear", 64, 8, False, "bf16", 0, 0, True)], 0)
    double, expanded = pair(40, 64, "nf4", 64)
    before = double.state_dict()
    with pytest.raises(ValueError, match="the state's is not"):
        double.load_quantized(np.asarray(expanded.weight), expanded.quant_state())
    assert all(ref.same_bits(np.asarray(v), np.asarray(before[k])) for k, v in double.state_dict().items())
    with pytest.raises(ValueError, match="it needs quantization='nf4' or 'fp4'"):
        from_pretrained(BASE, quantization="int8", double_quant=True)
    with pytest.raises(ValueError, match="whose absmax is not double-quantized"):
        from_pretrained(os.path.join(HF, "llama-tiny-bnb-fp4"), double_quant=True)


def test_a_bnb_4bit_folder_keeps_its_double_quantized_absmax_as_stored():
    folder = os.path.join(HF, "llama-tiny-bnb-nf4")  # bnb_4bit_use_double_quant: true
    held, expanded = from_pretrained(folder), from_pretrained(folder, double_quant=False)
    name = "model.layers.1.mlp.down_proj.weight"
    layer = held.get_submodule(name.removesuffix(".weight"))
    assert layer.double_quant and not expanded.get_submodule(name.removesuffix(".weight")).double_quant
    stored = checkpoint_tensors(folder)
    assert np.array_equal(held.state_dict()[name + ".absmax"], read_raw(stored[name + ".absmax"]))
    assert ref.same_bits(held.state_dict()[name + ".nested_absmax"], read_raw(stored[name + ".nested_absmax"]))
    ids = np.load(os.path.join(HF, "llama-tiny-bnb.npz"))["ids"]
    assert ref.same_bits(held(ids), expanded(ids))
    assert not from_pretrained(os.path.join(HF, "llama-tiny-bnb-fp4")).model.layers[0].mlp.up_proj.double_quant


def test_qlora_on_a_double_quantized_base_trains_the_bits_of_the_expanded_one():
    double = from_pretrained(BASE, quantization="nf4", blocksize=32, double_quant=True)
    expanded = from_pretrained(BASE, quantization="nf4", blocksize=32)
    for name, layer in double.named_modules():  # the same (lossy) absmax, expanded to float32
        if isinstance(layer, nn.QLinear):
            expanded.get_submodule(name).load_quantized(np.asarray(layer.weight), layer.quant_state())

    results = []
    for model in (adapted_with_acting_b(double, 4), adapted_with_acting_b(expanded, 4)):
        model.train()
        step = gt.TrainStep(model, nn.CrossEntropyLoss(), gt.optim.AdamW(model.parameters(), lr=1e-2),
                            precision="bf16")
        ids = np.random.default_rng(5).integers(0, 96, (2, 9))
        losses = [step(ids, model.shift_labels(ids)).loss for _ in range(2)]
        results.append((losses, {n: p.data.copy() for n, p in model.named_parameters() if p.requires_grad}))
    (d_losses, d_params), (e_losses, e_params) = results
    assert d_losses == e_losses and all(ref.same_bits(d_params[n], e_params[n]) for n in d_params)


@pytest.mark.sim
def test_a_sim_step_gives_the_cpu_bits_and_peaks_at_its_plan():
    def build():
        model = from_pretrained(BASE, quantization="nf4", blocksize=32, double_quant=True, quantize_embeddings=True)
        gt.random.manual_seed(6)
        return get_peft_model(model, LoraConfig(r=4, target_modules="all-linear"))

    def make_step(model):
        model.train()
        return gt.TrainStep(model, nn.CrossEntropyLoss(), gt.optim.AdamW(model.parameters(), lr=1e-2),
                            precision="bf16", loss_chunk_rows=5)

    ids = np.random.default_rng(7).integers(0, 96, (2, 9))
    labels = np.concatenate([ids[:, 1:], np.full((2, 1), -100)], axis=1)
    assert_sim_gives_the_cpu_bits_at_its_plan(build, make_step, [(ids, labels)] * 2, (2, 3, 9))

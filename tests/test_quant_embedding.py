"""A token table and an untied LM head frozen in 4 bits (issue 23 item 7, "with them quantized"):
QTokenEmbedding, the decoders' quantize_embeddings_() and from_pretrained(..., quantize_embeddings=True).

The table is held in bitsandbytes' 4-bit layout (NF4/FP4 codes of the flattened table, a
float32 absmax per block, blocks within a row); the lookup dequantizes the rows it reads with
QLinear's element math, so a model computes the bits of one whose float32 table holds the
dequantized values. The head is a QLinear of the same type.
"""

from __future__ import annotations

import numpy as np
import pytest

import gputrain as gt
from gputrain import nn
from gputrain.models import from_pretrained
from gputrain.models.hf.folder import float_state_dict
from gputrain.peft import LoraConfig, get_peft_model
from gputrain.quant import quantize_4bit, reference
from gputrain.quant.codes import code_table

import _reference as ref
from _peft_helpers import BASE, adapted_with_acting_b
from _sim_steps import assert_sim_gives_the_cpu_bits_at_its_plan


def aligned(n: int) -> int:
    return -(-n // 64) * 64


def tables(quant_type: str, blocksize: int, vocab: int = 37, dim: int = 128, types: int = 0, seed: int = 0):
    """(QTokenEmbedding, TokenEmbedding whose float32 table holds the quantized one's values) with an
    attention mask (and `types` token-type rows)."""
    gt.random.manual_seed(seed)
    source = nn.TokenEmbedding(vocab, dim, types, attention_mask=True)
    q = nn.QTokenEmbedding.from_token_embedding(source, quant_type, blocksize)
    plain = nn.TokenEmbedding(vocab, dim, types, attention_mask=True)
    plain.weight.data = q.table()
    return q, plain


def rows(vocab: int, types: int, seq: int = 11, batch: int = 3, seed: int = 1) -> np.ndarray:
    """(batch, channels, seq) inputs: ids (every one of [0, vocab) among them), types, mask."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, (batch, seq))
    ids.reshape(-1)[: min(vocab, ids.size)] = np.arange(min(vocab, ids.size))
    channels = [ids] + ([rng.integers(0, types, (batch, seq))] if types else []) + [np.ones((batch, seq), np.int64)]
    return np.stack(channels, axis=1).astype(np.int64)


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("blocksize", [32, 64, 128])
def test_the_table_is_bitsandbytes_codes_of_the_flattened_table_and_reads_back_by_the_reference(quant_type,
                                                                                                  blocksize):
    q, _ = tables(quant_type, blocksize)
    gt.random.manual_seed(0)  # the table tables() quantized, quantized again by the NumPy reference
    values = nn.TokenEmbedding(37, 128, 0, attention_mask=True).weight.data
    code = code_table(quant_type)
    packed, absmax = reference.quantize_4bit(values, code, blocksize)
    state = q.state_dict()
    assert state["weight"].dtype == np.uint8 and state["weight"].shape == (37 * 128 // 2, 1)
    assert np.array_equal(state["weight"].reshape(-1), packed)
    assert ref.same_bits(state["weight.absmax"], absmax)
    want = reference.dequantize_4bit(packed, absmax, code, blocksize, values.size).reshape(values.shape)
    assert ref.same_bits(q.table(), want)


@pytest.mark.parametrize("device", ["cpu", pytest.param("sim", marks=pytest.mark.sim)])
@pytest.mark.parametrize("precision", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("types", [0, 3])
def test_the_lookup_gives_the_bits_of_a_float32_table_holding_its_values(device, precision, quant_type, types):
    q, plain = tables(quant_type, 32, types=types)
    x = rows(37, types)
    outs = []
    for layer in (q, plain):
        layer = layer.to(device)
        layer.compiled.precision = precision
        outs.append(np.asarray(layer(x)))
    assert ref.same_bits(outs[0], outs[1])


def test_the_table_is_frozen_and_refuses_training_tying_and_shapes_it_cannot_hold():
    q, _ = tables("nf4", 64)
    with pytest.raises(ValueError, match="alone is frozen"):
        q.requires_grad_(True)
    assert list(q.parameters()) == []
    with pytest.raises(ValueError, match="holds its table in nf4 alone; a TiedLinear reads a float32 table"):
        nn.TiedLinear(q)
    with pytest.raises(ValueError, match="embedding_dim 96 is not a multiple of blocksize 64"):
        nn.QTokenEmbedding(10, 96, blocksize=64)
    with pytest.raises(ValueError, match="quant_type must be one of"):
        nn.QTokenEmbedding(10, 64, quant_type="int8")
    with pytest.raises(ValueError, match="blocksize must be one of"):
        nn.QTokenEmbedding(10, 64, blocksize=48)
    before = q.state_dict()
    with pytest.raises(ValueError, match=r"table: expected shape \(37, 128\)"):
        q.quantize_(np.zeros((36, 128), np.float32))
    assert all(ref.same_bits(before[k], v) for k, v in q.state_dict().items())


def test_the_spec_parser_refuses_a_block_that_does_not_divide_a_row():
    with pytest.raises(ValueError, match="embedding_dim 96 is not a multiple of blocksize 64"):
        gt._C.Model([("tokens", 16, 96, 0, False, False, -1, "nf4", 64)], 0)
    with pytest.raises(ValueError, match="blocksize must be 0 for a table that is not quantized"):
        gt._C.Model([("tokens", 16, 64, 0, False, False, -1, "f32", 64)], 0)
    with pytest.raises(ValueError, match="cannot read a TokenEmbedding table held in 4 bits"):
        gt._C.Model([("tokens", 16, 64, 0, False, False, -1, "nf4", 64), ("tied_linear", 0)], 0)


def test_the_plan_holds_half_a_byte_an_element_and_an_absmax_a_block():
    q, plain = tables("nf4", 32)
    shape = (3, 2, 11)
    got = gt.TrainStep(q, gt.nn.MSELoss()).memory_plan(shape)
    want = gt.TrainStep(plain, gt.nn.MSELoss()).memory_plan(shape)
    elements = 37 * 128
    assert want["parameters"] - got["parameters"] == 4 * elements
    assert got["buffers"] - want["buffers"] == aligned(elements // 2) + aligned(4 * elements // 32)


# -- a decoder's embeddings ---------------------------------------------------------------------
def float_ends(model: nn.Module) -> nn.Module:
    """The fixture Llama (4-bit blocks as `model`'s) with its float32 table and head holding the
    values `model`'s quantized ones give."""
    twin = from_pretrained(BASE, quantization="nf4", blocksize=32)
    twin.load_state_dict({"model.embed_tokens.weight": model.model.embed_tokens.table(),
                          "lm_head.weight": model.lm_head.dequantize()}, strict=False)
    return twin


def test_quantize_embeddings_holds_the_table_and_head_in_4_bits_with_the_float_path_s_bits():
    model = from_pretrained(BASE, quantization="nf4", blocksize=32)
    before = model.state_dict()
    gt.random.manual_seed(3)
    expected_seed = gt.random.next_seed()
    gt.random.manual_seed(3)
    assert model.quantize_embeddings_("nf4", 32) is model
    assert gt.random.next_seed() == expected_seed  # building the layers drew no seed
    table, head = model.model.embed_tokens, model.lm_head
    assert isinstance(table, nn.QTokenEmbedding) and isinstance(head, nn.QLinear) and head.quant_type == "nf4"
    assert not [n for n, _ in model.named_parameters() if "embed" in n or "lm_head" in n]
    packed, _ = quantize_4bit(before["model.embed_tokens.weight"], 32, "nf4")
    assert np.array_equal(np.asarray(table.weight).reshape(-1), packed.reshape(-1))
    twin = float_ends(model)
    ids = np.random.default_rng(4).integers(0, 96, (2, 9))
    assert ref.same_bits(model(ids), twin(ids))
    assert model.quantize_embeddings_("nf4", 32) is model and model.model.embed_tokens is table  # once is enough


def test_lora_on_a_model_with_4_bit_embeddings_trains_the_float_path_s_bits():
    quantized = from_pretrained(BASE, quantization="nf4", blocksize=32).quantize_embeddings_("nf4", 32)
    twin = float_ends(quantized)
    results = []
    for model in (adapted_with_acting_b(quantized, 5), adapted_with_acting_b(twin, 5)):
        model.train()
        step = gt.TrainStep(model, gt.nn.CrossEntropyLoss(), gt.optim.AdamW(model.parameters(), lr=1e-2),
                            precision="bf16", loss_chunk_rows=5)
        ids = np.random.default_rng(6).integers(0, 96, (2, 9))
        losses = [step(ids, model.shift_labels(ids)).loss for _ in range(2)]
        results.append((losses, {n: p.data.copy() for n, p in model.named_parameters() if p.requires_grad}))
    (q_losses, q_params), (f_losses, f_params) = results
    assert q_losses == f_losses and q_params.keys() == f_params.keys()
    assert all(ref.same_bits(q_params[n], f_params[n]) for n in q_params)


def test_from_pretrained_quantizes_the_embeddings_as_it_loads():
    loaded = from_pretrained(BASE, quantization="fp4", blocksize=64, quantize_embeddings=True)
    after = from_pretrained(BASE, quantization="fp4", blocksize=64).quantize_embeddings_("fp4", 64)
    assert isinstance(loaded.model.embed_tokens, nn.QTokenEmbedding) and isinstance(loaded.lm_head, nn.QLinear)
    want = after.state_dict()
    assert all(ref.same_bits(np.asarray(v), np.asarray(want[k])) for k, v in loaded.state_dict().items())
    with pytest.raises(ValueError, match="quantize_embeddings=True stores the embeddings in 4 bits"):
        from_pretrained(BASE, quantization="int8", quantize_embeddings=True)
    with pytest.raises(ValueError, match="it needs quantization='nf4' or 'fp4', got None"):
        from_pretrained(BASE, quantize_embeddings=True)


def test_a_tied_head_or_an_adapted_model_is_refused_with_nothing_changed():
    model = from_pretrained(BASE)
    peft = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"]))
    with pytest.raises(ValueError, match="inside another"):
        model.quantize_embeddings_()
    tied = gt.models.LlamaForCausalLM(dict(model.hf_values, tie_word_embeddings=True))
    with pytest.raises(ValueError, match="tied to the token table"):
        tied.quantize_embeddings_()
    untied = from_pretrained(BASE)
    before = untied.state_dict()
    with pytest.raises(ValueError, match="hidden_size|embedding_dim 64 is not a multiple of blocksize 128"):
        untied.quantize_embeddings_("nf4", 128)
    assert type(untied.model.embed_tokens) is nn.TokenEmbedding and type(untied.lm_head) is nn.Linear
    assert all(ref.same_bits(before[k], v) for k, v in untied.state_dict().items())
    del peft


def test_generate_reads_the_dequantized_values_and_save_pretrained_refuses_them(tmp_path):
    model = from_pretrained(BASE).quantize_embeddings_("nf4", 64)
    state = float_state_dict(model)
    assert ref.same_bits(state["model.embed_tokens.weight"], model.model.embed_tokens.table())
    assert ref.same_bits(state["lm_head.weight"], model.lm_head.dequantize())
    assert not [k for k in state if k.endswith(".absmax")]
    ids = np.arange(5)[None]
    assert model.generate(ids, 3).shape == (1, 8)
    with pytest.raises(ValueError, match="gputrain saves float folders only"):
        model.save_pretrained(tmp_path)
    assert not list(tmp_path.iterdir())


@pytest.mark.sim
def test_a_sim_step_gives_the_cpu_bits_and_peaks_at_its_plan():
    def build():
        model = from_pretrained(BASE, quantization="nf4", blocksize=32, quantize_embeddings=True)
        gt.random.manual_seed(8)
        return get_peft_model(model, LoraConfig(r=4, target_modules="all-linear"))

    def make_step(model):
        model.train()
        return gt.TrainStep(model, gt.nn.CrossEntropyLoss(), gt.optim.AdamW(model.parameters(), lr=1e-2),
                            precision="bf16", loss_chunk_rows=5)

    ids = np.random.default_rng(9).integers(0, 96, (2, 9))
    labels = np.concatenate([ids[:, 1:], np.full((2, 1), -100)], axis=1)
    assert_sim_gives_the_cpu_bits_at_its_plan(build, make_step, [(ids, labels)] * 2, (2, 3, 9))

"""Decoder inputs (issue 21): the rope kind (RotaryEmbedding) on a fused [q | k | v] projection,
the rope op's attention_factor and its linear/yarn inverse frequencies, TokenEmbedding's position
ids and pad_token_id (key starts and last tokens), SequencePool("last"), and the
model(input_ids, attention_mask, position_ids) call. References: tests/_rope_reference.py (NumPy in
transformers' float32 arithmetic)."""

from __future__ import annotations

import os

import numpy as np
import pytest

import _reference as ref
import _rope_reference as rref
import gputrain as gt
from gputrain import _C, nn
from gputrain import _C_testing

H, K, D = 2, 1, 8
WIDTH = (H + 2 * K) * D
VOCAB = 40
DTS = {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}

ROPES = {  # name: (RotaryEmbedding kwargs, NumPy inv_freq, attention_factor)
    "default": ({"rope_type": "default", "theta": 10000.0}, lambda: rref.inv_freq_default(D, 10000.0), 1.0),
    "linear": ({"rope_type": "linear", "theta": 10000.0, "factor": 3.0},
               lambda: rref.inv_freq_linear(D, 10000.0, 3.0), 1.0),
    "llama3": ({"rope_type": "llama3", "theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
               lambda: rref.inv_freq_llama3(rref.inv_freq_default(D, 500000.0), 8.0, 1.0, 4.0, 64), 1.0),
    "yarn": ({"rope_type": "yarn", "theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32,
              "attention_factor": 1.1386, "beta_fast": 32.0, "beta_slow": 1.0},
             lambda: rref.inv_freq_yarn(D, 10000.0, 4.0, 32), 1.1386),
}


def decoder_rows(mask, positions, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, VOCAB, size=np.shape(mask)).astype(np.int64)
    return ids, np.asarray(mask, np.int64), np.asarray(positions, np.int64)


def rope_model(kwargs, pad_token_id=None):
    gt.random.manual_seed(1)
    return nn.Sequential(nn.TokenEmbedding(VOCAB, WIDTH, 0, True, position_ids=True, pad_token_id=pad_token_id),
                         nn.RotaryEmbedding(H, K, D, **kwargs))


def rope_reference(table, ids, positions, inv, dt, factor):
    """The tokens' rows in dt, q and k heads rotated as apply_rotary_pos_emb, v as they are."""
    x = ref.to_dtype(table[ids], dt)  # (B, T, (H + 2K) D)
    b, t = ids.shape
    heads = x.reshape(b, t, H + 2 * K, D).transpose(0, 2, 1, 3)  # (B, heads, T, D)
    qk = rref.apply(heads[:, :H + K], positions, inv, dt, attention_factor=factor)
    out = np.concatenate([qk, heads[:, H + K:]], axis=1)
    return out.transpose(0, 2, 1, 3).reshape(b, t, WIDTH)


# --- the op: inverse frequencies and attention_factor ------------------------------------------

@pytest.mark.parametrize("head_dim", [8, 64, 128])
def test_inv_freq_linear_and_yarn_are_transformers_float32(head_dim):
    lin = _C.op_rope_inv_freq(head_dim, 10000.0, 1.0, "linear", 2.5)
    assert ref.same_bits(lin, rref.inv_freq_linear(head_dim, 10000.0, 2.5))
    for truncate in (True, False):
        for orig, beta_fast, beta_slow in ((4096, 32.0, 1.0), (64, 8.0, 2.0), (2, 32.0, 1.0)):
            got = _C.op_rope_inv_freq(head_dim, 1e6, 1.0, "yarn", 8.0, original_max_position_embeddings=orig,
                                      beta_fast=beta_fast, beta_slow=beta_slow, truncate=truncate)
            want = rref.inv_freq_yarn(head_dim, 1e6, 8.0, orig, beta_fast, beta_slow, truncate)
            assert ref.same_bits(got, want), (truncate, orig)


def test_inv_freq_yarn_agrees_with_the_decoder_config_numpy():
    from gputrain.models.hf.decoders import Rope

    rope = Rope("yarn", 10000.0, 64, factor=4.0, original_max_position_embeddings=2048, attention_factor=1.2)
    got = _C.op_rope_inv_freq(64, 10000.0, 1.0, "yarn", 4.0, original_max_position_embeddings=2048)
    np.testing.assert_array_max_ulp(got, rope.inv_freq(), maxulp=4)  # its power is powf (1 ulp), then blended


def test_bad_inv_freq_fields_are_named():
    with pytest.raises(ValueError, match="rope_type must be"):
        _C.op_rope_inv_freq(8, 1e4, 1.0, "dynamic")
    with pytest.raises(ValueError, match="original_max_position_embeddings"):
        _C.op_rope_inv_freq(8, 1e4, 1.0, "yarn", 2.0, original_max_position_embeddings=0.0)
    with pytest.raises(ValueError, match="factor"):
        _C.op_rope_inv_freq(8, 1e4, 1.0, "linear", 0.0)


@pytest.mark.parametrize("dt", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("backward", [False, True])
def test_attention_factor_scales_cos_and_sin_and_one_changes_no_bit(dt, backward):
    rng = np.random.default_rng(3)
    x = ref.to_dtype(rng.standard_normal((2, 3, 5, 16)), dt)
    pos = rng.integers(0, 500, size=(2, 5)).astype(np.int64)
    inv = rref.inv_freq_default(16, 10000.0)
    raw = x.view(np.uint16) if dt == "bf16" else x  # the binding's bf16 is raw uint16

    def run(**kwargs):
        out = np.empty_like(raw)
        _C.op_rope(out, raw, pos, inv, dt, 1, backward=backward, **kwargs)
        return out.view(x.dtype)

    for factor in (1.0, 0.75, 1.3):
        want = rref.apply(x, pos, inv, dt, backward=backward, attention_factor=factor)
        assert ref.same_bits(run(attention_factor=factor), want), factor
    assert ref.same_bits(run(), run(attention_factor=1.0))
    one = np.empty_like(raw)
    with pytest.raises(ValueError, match="attention_factor"):
        _C.op_rope(one, raw, pos, inv, dt, 1, attention_factor=0.0)


# --- the rope kind -----------------------------------------------------------------------------

MASKS = {  # (mask, position_ids or None: the default 0..T-1)
    "given": ([[1, 1, 1, 1, 1], [1, 1, 1, 1, 1]], [[3, 4, 5, 6, 7], [0, 9, 2, 40, 1]]),
    "default": ([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]], None),
    "restarting": ([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]], [[0, 1, 0, 1, 2], [0, 0, 0, 1, 2]]),
}


def forward(model, x, precision="fp32", device="cpu"):
    model.compiled.precision = DTS[precision] if precision != "fp32" else "f32"
    return model.compiled.forward(x)


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("rope", list(ROPES))
@pytest.mark.parametrize("case", list(MASKS))
def test_the_rope_layer_rotates_q_and_k_and_passes_v(precision, rope, case):
    kwargs, inv_freq, factor = ROPES[rope]
    mask, positions = MASKS[case]
    ids, mask, _ = decoder_rows(mask, mask)
    model = rope_model(kwargs)
    out = forward(model, nn.sequence.pack_decoder_inputs(ids, mask, positions), precision)
    used = np.broadcast_to(np.arange(5), ids.shape) if positions is None else np.asarray(positions)
    want = rope_reference(model.state_dict()["0.weight"], ids, used, inv_freq(), DTS[precision], factor)
    assert ref.same_bits(ref.to_dtype(out, DTS[precision]), want)
    assert list(model.state_dict()) == ["0.weight"]  # inv_freq is no parameter and no buffer
    if precision == "fp32" and positions is None:  # the Python call packs the same rows
        assert ref.same_bits(model(ids, attention_mask=mask), out)


def test_the_rope_layer_backward_is_the_transpose_rotation():
    kwargs, inv_freq, factor = ROPES["yarn"]
    ids, mask, positions = decoder_rows([[1, 1, 1, 1, 1], [0, 1, 1, 1, 1]], [[0, 1, 2, 0, 1], [0, 0, 1, 2, 3]])
    model = rope_model(kwargs)
    x = nn.sequence.pack_decoder_inputs(ids, mask, positions)
    target = np.random.default_rng(2).standard_normal((2, 5, WIDTH)).astype(np.float32)
    out = model(x)
    gt.TrainStep(model, nn.MSELoss(), None)(x, target)
    dout = 2 * (out - target) / out.size
    heads = dout.reshape(2, 5, H + 2 * K, D).transpose(0, 2, 1, 3)
    qk = rref.apply(heads[:, :H + K].astype(np.float32), positions, inv_freq(), "f32", backward=True,
                    attention_factor=factor)
    din = np.concatenate([qk, heads[:, H + K:]], axis=1).transpose(0, 2, 1, 3).reshape(2, 5, WIDTH)
    want = np.zeros((VOCAB, WIDTH))
    np.add.at(want, ids, din.astype(np.float64))
    np.testing.assert_allclose(next(model.parameters()).grad, want, rtol=1e-5, atol=1e-7)


# --- key starts and last tokens: the key_starts op ------------------------------------------------

def numpy_key_starts(mask, positions):
    starts = np.zeros(mask.shape, np.int64)
    for b in range(mask.shape[0]):
        start = 0
        for t in range(mask.shape[1]):
            if t and ((mask[b, t] != 0) != (mask[b, t - 1] != 0) or (mask[b, t] and positions[b, t] == 0)):
                start = t
            starts[b, t] = start
    return starts


def hf_last_tokens(ids, pad):
    """transformers' (arange(T) * (ids != pad)).argmax(-1)."""
    return (np.arange(ids.shape[1]) * (ids != pad)).argmax(-1)


ROWS = {  # mask, positions
    "left padding": ([0, 0, 1, 1, 1, 1], [0, 0, 0, 1, 2, 3]),
    "left padding, arange positions": ([0, 0, 1, 1, 1, 1], [0, 1, 2, 3, 4, 5]),
    "right padding": ([1, 1, 1, 1, 0, 0], [0, 1, 2, 3, 4, 5]),
    "packed": ([1, 1, 1, 1, 1, 1], [0, 1, 2, 0, 1, 0]),
    "packed and padded": ([1, 1, 1, 1, 0, 0], [0, 1, 0, 1, 0, 0]),
    "all padding": ([0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]),
}


@pytest.mark.parametrize("backend", ["cpu", pytest.param("sim", marks=pytest.mark.sim)])
def test_key_starts_split_rows_at_mask_changes_and_restarting_positions(backend):
    mask = np.array([m for m, _ in ROWS.values()], np.int64)
    positions = np.array([p for _, p in ROWS.values()], np.int64)
    ids = np.random.default_rng(0).integers(1, 9, size=mask.shape).astype(np.int64)
    ids[0, :2] = ids[4, 4:] = ids[5] = 0  # pads: left, right, a whole row
    ids[3, 5] = 0  # a pad id inside a row: the last token is before it
    rows = np.ascontiguousarray(np.stack([ids, mask, positions], axis=1))
    starts, last = np.full(mask.shape, -7, np.int64), np.full(len(mask), -7, np.int64)
    _C_testing.run_op(backend, "key_starts", [starts, last, rows], (len(mask), 6, 3, 0))
    np.testing.assert_array_equal(starts, numpy_key_starts(mask, positions))
    assert starts.tolist()[0] == [0, 0, 2, 2, 2, 2] and starts.tolist()[3] == [0, 0, 0, 3, 3, 5]
    np.testing.assert_array_equal(last, hf_last_tokens(ids, 0))
    assert last[5] == 0 and last[0] == 5  # all padding: 0 (argmax of zeros); no right padding: T - 1
    _C_testing.run_op(backend, "key_starts", [None, last, rows], (len(mask), 6, 3, -1))
    assert (last == 5).all()  # no pad_token_id: the last position


@pytest.mark.parametrize("backend", ["cpu", pytest.param("sim", marks=pytest.mark.sim)])
@pytest.mark.parametrize("dt", ["f32", "bf16", "f16"])
def test_pool_last_takes_the_last_token_and_its_gradient_goes_there(backend, dt):
    rng = np.random.default_rng(4)
    x = ref.to_dtype(rng.standard_normal((3, 5, 4)), dt)
    raw = x.view(np.uint16) if dt == "bf16" else x
    last = np.array([4, 0, 2], np.int64)
    out = np.zeros((3, 4), raw.dtype)
    _C_testing.run_op(backend, "pool_forward", [out, raw, last], (3, 5, 4, 2, dt))
    assert ref.same_bits(out.view(x.dtype), x[np.arange(3), last])
    _C_testing.run_op(backend, "pool_forward", [out, raw, None], (3, 5, 4, 2, dt))
    assert ref.same_bits(out.view(x.dtype), x[:, -1])  # without last tokens: T - 1
    dout = ref.to_dtype(rng.standard_normal((3, 4)), dt)
    din = np.full(raw.shape, 7, raw.dtype)
    _C_testing.run_op(backend, "pool_backward", [din, dout.view(raw.dtype), last], (3, 5, 4, 2, dt))
    want = np.zeros(x.shape, x.dtype)
    want[np.arange(3), last] = dout
    assert ref.same_bits(din.view(x.dtype), want)
    if backend != "cpu":  # a device backend reports a bad index at its next synchronisation
        return
    with pytest.raises(ValueError, match=r"lengths\[0\]: must be in \[0, 4\], got 5"):
        _C_testing.run_op(backend, "pool_forward", [out, raw, np.array([5, 0, 0], np.int64)], (3, 5, 4, 2, dt))


def test_a_classifier_pools_the_last_non_pad_token():
    gt.random.manual_seed(0)
    model = nn.Sequential(nn.TokenEmbedding(VOCAB, WIDTH, 0, True, position_ids=True, pad_token_id=0),
                          nn.SequencePool("last"))
    ids = np.array([[5, 6, 7, 0, 0], [0, 0, 3, 4, 9], [0, 0, 0, 0, 0], [1, 2, 0, 3, 0]])
    mask = (ids != 0).astype(np.int64)
    table = model.state_dict()["0.weight"]
    np.testing.assert_array_equal(model(ids, attention_mask=mask), table[ids[np.arange(4), hf_last_tokens(ids, 0)]])
    plain = nn.Sequential(nn.TokenEmbedding(VOCAB, WIDTH, 0, True, position_ids=True), nn.SequencePool("last"))
    np.testing.assert_array_equal(plain(ids), plain.state_dict()["0.weight"][ids[:, -1]])


# --- encoders unchanged, the Python call, bad input -------------------------------------------------

def test_an_encoder_tokens_spec_keeps_its_defaults():
    layer = nn.TokenEmbedding(10, 4, 2, True)
    assert layer._spec() == ("tokens", 10, 4, 2, True, False, -1, "f32", 0) and layer.channels == 3


def test_bad_decoder_inputs_raise_clear_errors():
    model = rope_model(ROPES["default"][0])
    ids = np.ones((2, 5), np.int64)
    with pytest.raises(ValueError, match="attention_mask must hold only 0 and 1, got 2"):
        model(ids, attention_mask=np.full((2, 5), 2))
    with pytest.raises(ValueError, match="position_ids must be >= 0"):
        model(ids, position_ids=-np.ones((2, 5), np.int64))
    with pytest.raises(ValueError, match=r"position_ids must have the shape of input_ids \(2, 5\)"):
        model(ids, position_ids=np.zeros((2, 4), np.int64))
    with pytest.raises(ValueError, match="position_ids must be a 2-D integer array"):
        model(ids, position_ids=np.zeros((2, 5), np.float32))
    with pytest.raises(ValueError, match="token_type_ids"):
        model(ids, token_type_ids=ids)
    encoder = nn.Sequential(nn.TokenEmbedding(10, 4, 0, True), nn.SequencePool("cls"))
    with pytest.raises(ValueError, match="position_ids: the model's TokenEmbedding has position_ids=False"):
        encoder(ids, attention_mask=np.ones((2, 5)), position_ids=np.zeros((2, 5), np.int64))
    with pytest.raises(ValueError, match="position_ids=True needs attention_mask=True"):
        nn.TokenEmbedding(10, 4, position_ids=True)
    with pytest.raises(ValueError, match="pad_token_id must be >= 0"):
        nn.TokenEmbedding(10, 4, 0, True, position_ids=True, pad_token_id=-1)
    with pytest.raises(ValueError, match="head_dim must be even"):
        nn.RotaryEmbedding(2, 1, 7)
    with pytest.raises(ValueError, match="rope_type must be one of"):
        nn.RotaryEmbedding(2, 1, 8, "dynamic")
    with pytest.raises(ValueError, match="original_max_position_embeddings"):
        nn.RotaryEmbedding(2, 1, 8, "yarn", factor=2.0)
    with pytest.raises(ValueError, match="expects 32 input features"):
        nn.Sequential(nn.Linear(3, 16), nn.RotaryEmbedding(2, 1, 8))(np.zeros((1, 2, 3), np.float32))
    before = model.state_dict()["0.weight"].copy()
    with pytest.raises(IndexError, match=r"ids\[0\] = 40 is out of range"):
        model(np.ones((2, 3, 5), np.int64) * VOCAB)  # ids out of range
    np.testing.assert_array_equal(model.state_dict()["0.weight"], before)


# --- the simulated device and the memory plan ----------------------------------------------------

def classifier():
    gt.random.manual_seed(7)
    return nn.Sequential(nn.TokenEmbedding(VOCAB, WIDTH, 0, True, position_ids=True, pad_token_id=0),
                         nn.Residual(nn.RotaryEmbedding(H, K, D, **ROPES["yarn"][0]), nn.Linear(WIDTH, WIDTH)),
                         nn.SequencePool("last"), nn.Linear(WIDTH, 3))  # checkpointing recomputes the rope


def classifier_data():
    rng = np.random.default_rng(5)
    ids = rng.integers(1, VOCAB, size=(8, 6)).astype(np.int64)
    ids[:3, 4:] = 0  # right padding
    ids[3:5, :2] = 0  # left padding
    mask = (ids != 0).astype(np.int64)
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    return nn.sequence.pack_decoder_inputs(ids, mask, positions), rng.integers(0, 3, 8)


@pytest.mark.sim
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_decoder_classifier_trains_on_sim_as_on_the_cpu(precision):
    x, y = classifier_data()

    def train(device):
        model = classifier().to(device)
        step = gt.TrainStep(model, nn.CrossEntropyLoss(), gt.optim.AdamW.for_model(model, lr=1e-2),
                            precision=precision, micro_batches=2)
        losses = [step(x, y).loss for _ in range(3)]
        return losses, model.compiled.read_parameters()

    (cpu_losses, cpu_params), (sim_losses, sim_params) = train("cpu"), train("sim")
    assert sim_losses == cpu_losses
    np.testing.assert_array_equal(sim_params, cpu_params)


def test_checkpointing_recomputes_the_rope_with_the_same_bits():
    x, y = classifier_data()
    grads = []
    for checkpointing in (False, True):
        model = classifier()
        gt.TrainStep(model, nn.CrossEntropyLoss(), None, precision="bf16", gradient_checkpointing=checkpointing)(x, y)
        assert model.compiled.checkpointing == checkpointing
        grads.append(model.compiled.read_gradients())
    assert ref.same_bits(grads[0], grads[1])


def test_checkpointing_keeps_one_input_per_decoder_layer():
    """A decoder layer is one checkpointed unit, as transformers checkpoints it: its two residual
    blocks are recomputed together, so a layer more keeps one (batch, T, hidden) activation, not two."""
    import json

    from gputrain.memory_plan import plan_training

    with open(os.path.join(os.path.dirname(__file__), "fixtures", "hf", "llama-tiny", "config.json")) as f:
        config = json.load(f)
    kept = []
    for layers in (1, 2, 3):
        model = gt.models.LlamaForCausalLM(dict(config, num_hidden_layers=layers))
        kept.append(plan_training(model, (2, 3, 16), precision="bf16", checkpointing=True)["cpu"]["activations"])
    def aligned(n: int) -> int:
        return -(-n // 64) * 64

    hidden = 2 * 16 * config["hidden_size"] * 2  # the layer's input, bf16
    rope = config["head_dim"] // 2 * 4  # its rotary embedding's inverse frequencies, placed once
    assert kept[2] - kept[1] == kept[1] - kept[0] == aligned(hidden) + aligned(rope)


@pytest.mark.sim
@pytest.mark.parametrize("config", [{}, {"bf16": True, "gradient_checkpointing": True}], ids=["fp32", "bf16"])
def test_a_sim_decoder_run_peaks_at_its_memory_plan(tmp_path, config):
    from test_memory_plan import args, measured

    x, y = classifier_data()
    m = classifier().to("sim")
    with measured(("cpu",)):
        gt.reset_peak_memory_stats("sim:0")
        trainer = gt.Trainer(m, args(tmp_path, device="sim", **config), train_dataset=(x, y))
        plan = trainer.memory_plan()
        trainer.train()
        device_peak = gt.memory_stats("sim:0")["peak_reserved_bytes"]
    assert device_peak == plan.total("sim:0"), str(plan)


def test_train_step_packs_input_ids_with_the_mask_and_positions_or_their_defaults():
    x, y = classifier_data()
    ids, mask, positions = x[:, 0], x[:, 1], x[:, 2]
    losses = []
    for kwargs in ({"attention_mask": mask, "position_ids": positions}, None):
        model = classifier()
        step = gt.TrainStep(model, nn.CrossEntropyLoss(), None)
        losses.append(step(ids, y, **kwargs).loss if kwargs else step(x, y).loss)
    assert losses[0] == losses[1]
    model = classifier()
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), None)
    defaults = step(ids, y).loss  # mask ones, positions 0..T-1
    model = classifier()
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), None)
    explicit = step(nn.sequence.pack_decoder_inputs(ids, np.ones_like(ids), np.tile(np.arange(6), (8, 1))), y).loss
    assert defaults == explicit
    with pytest.raises(ValueError, match="attention_mask must hold only 0 and 1"):
        step(ids, y, attention_mask=mask * 3)


# --- with the grouped-query attention kind: the key starts mask the segments --------------------

class _Attention(nn.Module):
    """The bare attention kind on (B, T, (H + 2K) D): H query heads over K kv heads, causal."""

    def _spec(self) -> tuple:
        return ("attention", H * D, H, 0.0, True, K, D, 0, 0.0)


def test_rope_then_attention_sees_only_each_querys_segment():
    ids, mask, positions = decoder_rows([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]],
                                        [[0, 0, 0, 1, 2, 3], [0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 0]])
    kwargs, inv_freq, factor = ROPES["llama3"]
    gt.random.manual_seed(1)
    model = nn.Sequential(nn.TokenEmbedding(VOCAB, WIDTH, 0, True, position_ids=True),
                          nn.RotaryEmbedding(H, K, D, **kwargs), _Attention())
    out = model(ids, attention_mask=mask, position_ids=positions)
    x = rope_reference(model.state_dict()["0.weight"], ids, positions, inv_freq(), "f32", factor).astype(np.float64)
    starts = numpy_key_starts(mask, positions)
    b_n, t_n = ids.shape
    q = x[..., :H * D].reshape(b_n, t_n, H, D)
    k = x[..., H * D:(H + K) * D].reshape(b_n, t_n, K, D)
    v = x[..., (H + K) * D:].reshape(b_n, t_n, K, D)
    want = np.zeros((b_n, t_n, H, D))
    for b in range(b_n):
        for h in range(H):
            g = h // (H // K)
            scores = q[b, :, h] @ k[b, :, g].T / np.sqrt(D)
            i, j = np.indices(scores.shape)
            scores[(j > i) | (j < starts[b][:, None])] = -np.inf
            p = np.exp(scores - scores.max(1, keepdims=True))
            want[b, :, h] = (p / p.sum(1, keepdims=True)) @ v[b, :, g]
    np.testing.assert_allclose(out, want.reshape(b_n, t_n, H * D), rtol=1e-5, atol=1e-6)

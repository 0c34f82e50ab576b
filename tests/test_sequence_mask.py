"""The attention mask carried by a TokenEmbedding's input rows: every MultiheadAttention masks the
keys after each sequence's length and SequencePool pools its real tokens only. Checked against a
float64 NumPy reference (forward, loss and every parameter gradient, fp32/bf16/fp16, cls/mean
pooling, causal or not, with checkpointing), central finite differences, padding invariance
(logits and gradients of the real tokens do not depend on the padding or its token ids), gradient
accumulation, bit-identity on the simulated device, and the validation of the mask."""

from __future__ import annotations

import numpy as np
import pytest

import _attention_reference as aref
import gputrain as gt
from _mlp_reference import layer_backward as leaf_backward
from _mlp_reference import layer_forward as leaf_forward
from _mlp_reference import params_of

nn = gt.nn
VOCAB, TYPES, EMBED, HEADS, SEQ, CLASSES = 11, 2, 8, 2, 7, 3
LENGTHS = np.array([7, 3, 1, 5])
GRAD_TOLERANCE = {"fp32": 2e-5, "fp16": 1e-2, "bf16": 6e-2}


def make_model(pooling="mean", causal=False, types=TYPES, max_len=SEQ, seed=0):
    gt.random.manual_seed(seed)
    return nn.Sequential(
        nn.TokenEmbedding(VOCAB, EMBED, types, attention_mask=True),
        nn.PositionEmbedding(max_len, EMBED),
        nn.Residual(nn.LayerNorm(EMBED), nn.MultiheadAttention(EMBED, HEADS, causal=causal)),
        nn.Residual(nn.LayerNorm(EMBED), nn.Linear(EMBED, 2 * EMBED), nn.GELU(), nn.Linear(2 * EMBED, EMBED)),
        nn.LayerNorm(EMBED),
        nn.SequencePool(pooling),
        nn.Linear(EMBED, CLASSES))


def make_batch(lengths=LENGTHS, seq=SEQ, seed=1, pad_id=0):
    """(input_ids, attention_mask, token_type_ids, labels); padded positions hold `pad_id`
    (None: random ids, which the mask must make irrelevant)."""
    rng = np.random.default_rng(seed)
    n = len(lengths)
    ids = rng.integers(0, VOCAB, (n, seq))
    types = (np.arange(seq)[None, :] >= (np.asarray(lengths)[:, None] + 1) // 2).astype(np.int64)
    mask = (np.arange(seq)[None, :] < np.asarray(lengths)[:, None]).astype(np.int64)
    if pad_id is not None:
        ids = np.where(mask == 1, ids, pad_id)
    types = np.where(mask == 1, types, 0)
    return ids, mask, types, rng.integers(0, CLASSES, n)


# -- float64 reference -------------------------------------------------------------------------

def forward(layer, x, params, lengths):
    if isinstance(layer, nn.TokenEmbedding):
        table = params[id(layer)]["weight"]
        ids, types = x[:, 0], x[:, 1] if layer.type_vocab_size else None
        out = table[ids] + (table[layer.num_embeddings + types] if types is not None else 0)
        return out, (ids, types)
    if isinstance(layer, nn.PositionEmbedding):
        return x + params[id(layer)]["weight"][:x.shape[1]], x.shape
    if isinstance(layer, nn.SequencePool):
        if layer.mode == "cls":
            return x[:, 0], x.shape
        keep = (np.arange(x.shape[1])[None, :] < lengths[:, None])[..., None]
        return (x * keep).sum(1) / lengths[:, None], x.shape
    if isinstance(layer, nn.MultiheadAttention):
        qkv, in_cache = leaf_forward(layer.in_proj, x, params)
        b, t, width = qkv.shape
        e, h = width // 3, layer.num_heads
        q, k, v = (qkv[..., i * e:(i + 1) * e].reshape(b, t, h, e // h).transpose(0, 2, 1, 3) for i in range(3))
        o, _ = aref.attention(q, k, v, layer.causal, key_lengths=lengths)
        y, out_cache = leaf_forward(layer.out_proj, o.transpose(0, 2, 1, 3).reshape(b, t, e), params)
        return y, (in_cache, (q, k, v), out_cache)
    if isinstance(layer, nn.Sequential):
        caches = []
        for child in layer.layers:
            x, cache = forward(child, x, params, lengths)
            caches.append(cache)
        return x, caches
    if isinstance(layer, nn.Residual):
        y, cache = forward(layer.block, x, params, lengths)
        return x + y, cache
    return leaf_forward(layer, x, params)


def backward(layer, dy, cache, params, grads, lengths):
    if isinstance(layer, nn.TokenEmbedding):
        ids, types = cache
        table = np.zeros_like(params[id(layer)]["weight"])
        np.add.at(table, ids.reshape(-1), dy.reshape(-1, table.shape[1]))
        if types is not None:
            np.add.at(table, layer.num_embeddings + types.reshape(-1), dy.reshape(-1, table.shape[1]))
        grads.setdefault(id(layer), {})["weight"] = table
        return None
    if isinstance(layer, nn.PositionEmbedding):
        table = np.zeros_like(params[id(layer)]["weight"])
        table[:dy.shape[1]] = dy.sum(0)
        grads.setdefault(id(layer), {})["weight"] = table
        return dy
    if isinstance(layer, nn.SequencePool):
        dx = np.zeros(cache)
        if layer.mode == "cls":
            dx[:, 0] = dy
        else:
            keep = (np.arange(cache[1])[None, :] < lengths[:, None])[..., None]
            dx[:] = keep * (dy / lengths[:, None])[:, None, :]
        return dx
    if isinstance(layer, nn.MultiheadAttention):
        in_cache, (q, k, v), out_cache = cache
        b, h, t, d = q.shape
        do = leaf_backward(layer.out_proj, dy, out_cache, params, grads).reshape(b, t, h, d).transpose(0, 2, 1, 3)
        parts = aref.attention_backward(do, q, k, v, layer.causal, key_lengths=lengths)
        dqkv = np.concatenate([g.transpose(0, 2, 1, 3).reshape(b, t, h * d) for g in parts], -1)
        return leaf_backward(layer.in_proj, dqkv, in_cache, params, grads)
    if isinstance(layer, nn.Sequential):
        for child, child_cache in zip(reversed(layer.layers), reversed(cache)):
            dy = backward(child, dy, child_cache, params, grads, lengths)
        return dy
    if isinstance(layer, nn.Residual):
        return dy + backward(layer.block, dy, cache, params, grads, lengths)
    return leaf_backward(layer, dy, cache, params, grads)


def reference(model, x, y):
    """(logits, loss, {(module id, name): gradient}) in float64 for packed rows x."""
    params = params_of(model)
    lengths = x[:, -1].sum(1)
    logits, cache = forward(model, x, params, lengths)
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    loss = -logp[np.arange(len(y)), y].mean()
    dlogits = np.exp(logp)
    dlogits[np.arange(len(y)), y] -= 1
    grads: dict = {}
    backward(model, dlogits / len(y), cache, params, grads, lengths)
    return logits, loss, {(m, name): g for m, named in grads.items() for name, g in named.items()}


def gradients(model):
    """{(module id, name): gradient} of the model's parameters after a step."""
    out = {}
    for module in model.modules():
        for name, parameter in module._params.items():
            out[(id(module), name)] = parameter.grad
    return out


# -- tests ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_step_matches_reference(pooling, causal, precision, checkpointing):
    model = make_model(pooling, causal)
    ids, mask, types, y = make_batch(pad_id=None)
    x = nn.pack_inputs(ids, mask, types)
    logits, loss, expected = reference(model, x, y)
    np.testing.assert_allclose(model(x), logits, rtol=1e-4, atol=1e-5)
    out = gt.TrainStep(model, nn.CrossEntropyLoss(), precision=precision, gradient_checkpointing=checkpointing)(x, y)
    tolerance = GRAD_TOLERANCE[precision]
    assert out.loss == pytest.approx(loss, rel=tolerance, abs=tolerance)
    got = gradients(model)
    assert set(got) == set(expected)
    for key, reference_grad in expected.items():
        error = np.linalg.norm(got[key] - reference_grad)
        assert error <= tolerance * np.linalg.norm(reference_grad) + 1e-6, f"{key}: off by {error:.3g}"


def test_mask_changes_the_result():
    """The reference without the mask differs: the test above would catch a mask ignored."""
    model = make_model("cls")
    ids, mask, types, _ = make_batch(pad_id=None)
    masked = model(ids, attention_mask=mask, token_type_ids=types)
    unmasked = model(ids, attention_mask=np.ones_like(mask), token_type_ids=types)
    assert np.abs(masked[1:] - unmasked[1:]).max() > 1e-3
    np.testing.assert_array_equal(masked[0], unmasked[0])  # the full-length row


def test_finite_differences():
    """Central differences of the C model's f32 loss against its gradient, for entries of every
    parameter (a padded token's embedding row included: its gradient must be 0)."""
    model = make_model("mean")
    ids, mask, types, y = make_batch(pad_id=None)
    ids = np.where(mask == 1, np.minimum(ids, VOCAB - 2), VOCAB - 1)  # VOCAB - 1: padding only
    x = nn.pack_inputs(ids, mask, types)
    gt.TrainStep(model, nn.CrossEntropyLoss())(x, y)
    grads = {name: p.grad.copy() for name, p in model.named_parameters()}

    def loss():
        logits = model(x).astype(np.float64)
        z = logits - logits.max(-1, keepdims=True)
        return -(z[np.arange(len(y)), y] - np.log(np.exp(z).sum(-1))).mean()

    rng = np.random.default_rng(0)
    eps = 1e-2
    for name, parameter in model.named_parameters():
        flat = parameter.data.reshape(-1)
        picks = list(rng.choice(flat.size, 3, replace=False))
        if name == "0.weight":
            picks.append((VOCAB - 1) * EMBED + 2)  # the padding token's row: never real
        for i in picks:
            old = flat[i]
            flat[i] = old + eps
            up = loss()
            flat[i] = old - eps
            down = loss()
            flat[i] = old
            numeric = (up - down) / (2 * eps)
            assert grads[name].reshape(-1)[i] == pytest.approx(numeric, abs=2e-3, rel=2e-2), (name, i)
    assert not grads["0.weight"][VOCAB - 1].any()


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_padding_does_not_change_real_tokens(pooling):
    """The same sequences padded to 7 and to 12 positions, with random ids in the padding: the
    same logits, loss and parameter gradients (up to the GEMMs' blocking)."""
    ids, mask, types, y = make_batch(pad_id=None)
    results = []
    for seq in (SEQ, 12):
        model = make_model(pooling, max_len=12)
        rng = np.random.default_rng(seq)
        wide = np.concatenate([ids, rng.integers(0, VOCAB, (len(ids), seq - SEQ))], 1)
        pad = np.zeros((len(ids), seq - SEQ), np.int64)
        x = nn.pack_inputs(wide, np.concatenate([mask, pad], 1), np.concatenate([types, pad], 1))
        logits = model(x)
        out = gt.TrainStep(model, nn.CrossEntropyLoss())(x, y)
        results.append((logits, out.loss, {n: p.grad.copy() for n, p in model.named_parameters()}))
    (a_logits, a_loss, a_grads), (b_logits, b_loss, b_grads) = results
    np.testing.assert_allclose(b_logits, a_logits, rtol=1e-5, atol=1e-6)
    assert b_loss == pytest.approx(a_loss, rel=1e-6)
    for name in a_grads:
        if name == "1.weight":  # positions: rows past 7 only get the (zero) padding gradients
            np.testing.assert_array_equal(b_grads[name][SEQ:], 0)
            np.testing.assert_allclose(b_grads[name][:SEQ], a_grads[name][:SEQ], rtol=1e-4, atol=1e-7)
        else:
            np.testing.assert_allclose(b_grads[name], a_grads[name], rtol=1e-4, atol=1e-7, err_msg=name)


def test_each_sequence_alone_gives_its_logits():
    """A padded batch gives every row the logits of that sequence run alone, unpadded."""
    model = make_model("mean")
    model.eval()
    ids, mask, types, _ = make_batch(pad_id=None)
    together = model(ids, attention_mask=mask, token_type_ids=types)
    for row, length in enumerate(LENGTHS):
        alone = model(ids[row:row + 1, :length], attention_mask=mask[row:row + 1, :length],
                      token_type_ids=types[row:row + 1, :length])
        np.testing.assert_allclose(alone[0], together[row], rtol=1e-5, atol=1e-6)


def test_gradient_accumulation_splits_the_mask_with_the_rows():
    ids, mask, types, y = make_batch(lengths=np.array([7, 2, 4, 1, 6, 3, 5, 7]), seed=4)
    grads = []
    for steps in (1, 2, 4):
        model = make_model("mean")
        step = gt.TrainStep(model, nn.CrossEntropyLoss(), micro_batches=steps)
        step(ids, y, attention_mask=mask, token_type_ids=types)
        grads.append(np.concatenate([p.grad.reshape(-1) for p in model.parameters()]))
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(grads[2], grads[0], rtol=1e-5, atol=1e-7)


@pytest.mark.sim
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_sim_device_is_bit_identical(precision):
    def train(device):
        model = make_model("mean").to(device)
        optimizer = gt.optim.AdamW.for_model(model, lr=1e-2)
        step = gt.TrainStep(model, nn.CrossEntropyLoss(), optimizer, precision=precision,
                            micro_batches=2)
        losses = []
        for i in range(3):
            ids, mask, types, y = make_batch(lengths=np.array([7, 2, 4, 1]), seed=10 + i, pad_id=None)
            losses.append(step(ids, y, attention_mask=mask, token_type_ids=types).loss)
        ids, mask, types, _ = make_batch(seed=20, pad_id=None)
        return losses, model.compiled.read_parameters(), model(ids, attention_mask=mask, token_type_ids=types)

    cpu, sim = train("cpu"), train("sim")
    np.testing.assert_array_equal(sim[0], cpu[0])
    np.testing.assert_array_equal(sim[1], cpu[1])
    np.testing.assert_array_equal(sim[2], cpu[2])


# -- validation ----------------------------------------------------------------------------------

@pytest.mark.parametrize("mask, message", [
    (np.array([[1, 0, 1], [1, 1, 1]]), "row 0 is not ones followed by zeros"),
    (np.array([[1, 1, 0], [0, 0, 0]]), "row 1 has no 1"),
    (np.array([[1, 2, 0], [1, 1, 1]]), "only 0 and 1"),
    (np.array([[1, 1], [1, 1]]), "shape of input_ids"),
    (np.array([[0.5, 1, 0], [1, 1, 1]]), "integer array"),
])
def test_bad_masks_are_refused(mask, message):
    model = make_model()
    before = model.state_dict()
    ids = np.ones((2, 3), np.int64)
    with pytest.raises(ValueError, match=message) as info:
        model(ids, attention_mask=mask, token_type_ids=np.zeros((2, 3), np.int64))
    assert "attention_mask" in str(info.value)
    with pytest.raises(ValueError, match="attention_mask"):
        gt.TrainStep(model, nn.CrossEntropyLoss())(ids, np.zeros(2, np.int64), attention_mask=mask,
                                                   token_type_ids=np.zeros((2, 3), np.int64))
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(value, before[name])


def test_inputs_the_model_does_not_read_are_refused():
    plain = nn.Sequential(nn.Linear(4, 4), nn.MultiheadAttention(4, 2))
    with pytest.raises(ValueError, match="attention_mask: Sequential does not read it"):
        plain(np.zeros((1, 3, 4), np.float32), attention_mask=np.ones((1, 3), np.int64))
    no_types = make_model(types=0)
    with pytest.raises(ValueError, match="token_type_ids: the model's TokenEmbedding has type_vocab_size=0"):
        no_types(np.ones((1, 3), np.int64), attention_mask=np.ones((1, 3), int), token_type_ids=np.zeros((1, 3), int))
    with pytest.raises(ValueError, match="attention_mask: required"):
        make_model()(np.ones((1, 3), np.int64), token_type_ids=np.zeros((1, 3), np.int64))


def test_shape_errors_name_the_input_and_layer():
    model = make_model()
    with pytest.raises(ValueError, match=r"x: layer '0' \(TokenEmbedding\(11, 8\)\) reads \(batch, 3, seq\)"):
        model(np.ones((2, 2, 5), np.int64))
    with pytest.raises(ValueError, match=r"x: a sequence of 9 positions does not fit"):
        model(np.ones((2, 9), np.int64), attention_mask=np.ones((2, 9), int), token_type_ids=np.zeros((2, 9), int))
    late = nn.Sequential(nn.Linear(4, 4), nn.TokenEmbedding(5, 4))
    with pytest.raises(TypeError, match="must be the model's first layer"):
        late(np.zeros((2, 4), np.float32))
    pool = nn.Sequential(nn.Linear(4, 4), nn.SequencePool("mean"))
    with pytest.raises(ValueError, match=r"takes \(batch, seq, dim\) inputs, but gets 2 dimensions"):
        pool(np.zeros((2, 4), np.float32))
    with pytest.raises(ValueError, match="mode must be 'cls', 'mean' or 'last'"):
        nn.SequencePool("max")
    with pytest.raises(ValueError, match="type_vocab_size must be >= 0"):
        nn.TokenEmbedding(5, 4, -1)
    with pytest.raises(IndexError, match="out of range"):
        model(np.full((1, 3), VOCAB), attention_mask=np.ones((1, 3), int), token_type_ids=np.zeros((1, 3), int))


@pytest.mark.parametrize("mode", ["cls", "mean"])
def test_pool_without_mask_reads_every_position(mode):
    """A float model with no TokenEmbedding: the pooling sees all positions; its gradient is the
    reference's (every position for mean, position 0 only for cls)."""
    gt.random.manual_seed(0)
    linear = nn.Linear(4, 3)
    model = nn.Sequential(linear, nn.SequencePool(mode))
    x = np.random.default_rng(0).standard_normal((2, 5, 4)).astype(np.float32)
    y = np.array([0, 2])
    h = x.astype(np.float64) @ linear.weight.data.T.astype(np.float64) + linear.bias.data
    pooled = h[:, 0] if mode == "cls" else h.mean(1)
    np.testing.assert_allclose(model(x), pooled, rtol=1e-5, atol=1e-6)
    gt.TrainStep(model, nn.CrossEntropyLoss())(x, y)
    p = np.exp(pooled - pooled.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    p[np.arange(2), y] -= 1
    dh = np.zeros_like(h)
    if mode == "cls":
        dh[:, 0] = p / 2
    else:
        dh[:] = (p / 2 / 5)[:, None, :]
    np.testing.assert_allclose(linear.weight.grad, dh.reshape(-1, 3).T @ x.reshape(-1, 4), rtol=1e-4, atol=1e-6)

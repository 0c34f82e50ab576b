"""gputrain.nn.MultiheadAttention (fused QKV Linear, the attention op, output Linear) as the first,
a middle and the last layer, inside a Residual and in a pre-LayerNorm transformer block: training
steps whose loss and parameter gradients match the float64 NumPy reference (tests/_mlp_reference.py
with tests/_attention_reference.py), dropout on the probabilities with the model's Philox key,
state_dict names, a tiny transformer that learns a sequence task, and clear errors."""

from __future__ import annotations

import numpy as np
import pytest

import _attention_reference as aref
import _reference as ref
import gputrain as gt
from _mlp_reference import layer_backward, layer_forward, params_of
from gputrain.optim import AdamW

nn = gt.nn

EMBED, HEADS, SEQ, BATCH, CLASSES = 8, 2, 7, 3, 5


def mha(**kwargs):
    return nn.MultiheadAttention(EMBED, HEADS, **kwargs)


def lin(n_in=EMBED, n_out=EMBED):
    return nn.Linear(n_in, n_out)


def pre_ln_block(**kwargs):
    """One pre-LayerNorm transformer block: attention and MLP, each in a Residual."""
    return nn.Sequential(
        nn.Residual(nn.Sequential(nn.LayerNorm(EMBED), mha(**kwargs))),
        nn.Residual(nn.Sequential(nn.LayerNorm(EMBED), lin(EMBED, 4 * EMBED), nn.GELU(),
                                  lin(4 * EMBED, EMBED))))


POSITIONS = {
    "first": lambda **kw: nn.Sequential(mha(**kw), lin(EMBED, CLASSES)),
    "middle": lambda **kw: nn.Sequential(lin(), mha(**kw), lin(EMBED, CLASSES)),
    "last": lambda **kw: nn.Sequential(lin(EMBED, 2 * HEADS), lin(2 * HEADS, EMBED), mha(**kw)),
    "in_residual": lambda **kw: nn.Sequential(lin(), nn.Residual(nn.LayerNorm(EMBED), mha(**kw)),
                                              lin(EMBED, CLASSES)),
    "block": lambda **kw: nn.Sequential(lin(), pre_ln_block(**kw), pre_ln_block(**kw),
                                        lin(EMBED, CLASSES)),
}

#: Relative error of the gradients against float64 (norm of the difference over the reference's).
GRAD_TOLERANCE = {"fp32": 2e-5, "fp16": 1e-2, "bf16": 6e-2}


def batch(seed=1):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((BATCH, SEQ, EMBED)).astype(np.float32)
    return x, rng.integers(0, CLASSES, (BATCH, SEQ))  # every model has >= CLASSES outputs


def dropout_ids(model):
    """Philox layer ids: Dropout layers and attention cores numbered in pre-order (as the C spec
    parser hands them out)."""
    kinds = (nn.Dropout, nn.MultiheadAttention)
    return {id(m): k for k, m in enumerate(m for m in model.modules() if isinstance(m, kinds))}


def multipliers(model):
    """The reference's dropout multipliers for the model's next step (one micro-batch)."""
    ids, seed, step = dropout_ids(model), model.compiled.seed, model.compiled.step

    def multiplier(layer, shape):
        if isinstance(layer, nn.MultiheadAttention):
            return aref.multipliers(shape, layer.dropout, seed, ids[id(layer)], step, 0)
        keep = ref.dropout_mask(int(np.prod(shape)), layer.p, seed, ids[id(layer)], step, 0)
        return keep.reshape(shape) * float(np.float32(1.0) / np.float32(1.0 - layer.p))

    return multiplier


def reference_step(model, x, y):
    params = params_of(model)
    logits, cache = layer_forward(model, x.astype(np.float64), params, multipliers(model))
    flat = logits.reshape(-1, logits.shape[-1])
    z = flat - flat.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    loss = -logp[np.arange(flat.shape[0]), y.reshape(-1)].mean()
    dflat = np.exp(logp)
    dflat[np.arange(flat.shape[0]), y.reshape(-1)] -= 1
    grads: dict = {}
    layer_backward(model, (dflat / flat.shape[0]).reshape(logits.shape), cache, params, grads)
    return loss, {(layer, name): g for layer, named in grads.items() for name, g in named.items()}


def check_step(model, precision="fp32", checkpointing=False):
    x, y = batch()
    loss, expected = reference_step(model, x, y)
    out = gt.TrainStep(model, nn.CrossEntropyLoss(), precision=precision,
                       gradient_checkpointing=checkpointing)(x, y)
    tolerance = GRAD_TOLERANCE[precision]
    assert out.loss == pytest.approx(loss, rel=tolerance, abs=tolerance)
    checked = 0
    for name, parameter in model.named_parameters():
        module = next(m for m in model.modules() if any(p is parameter for p in m._params.values()))
        local = next(k for k, p in module._params.items() if p is parameter)
        reference = expected[(id(module), local)]
        error = np.linalg.norm(parameter.grad - reference)
        assert error <= tolerance * np.linalg.norm(reference) + 1e-6, f"{name}: off by {error:.3g}"
        checked += 1
    assert checked == len(expected)


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("position", list(POSITIONS))
def test_step_gradients_match_reference(position, causal, precision, checkpointing):
    gt.random.manual_seed(0)
    check_step(POSITIONS[position](causal=causal), precision, checkpointing)


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
def test_attention_dropout_uses_the_models_philox_key(checkpointing):
    gt.random.manual_seed(0)
    model = nn.Sequential(nn.Dropout(0.1), POSITIONS["block"](dropout=0.3, causal=True))
    model.compiled.step = 4
    check_step(model, "fp32", checkpointing)


def test_eval_turns_attention_dropout_off():
    gt.random.manual_seed(0)
    with_dropout = mha(dropout=0.5)
    gt.random.manual_seed(0)
    without = mha()
    x, _ = batch()
    assert not np.array_equal(with_dropout(x), without(x))
    with_dropout.eval()
    np.testing.assert_array_equal(with_dropout(x), without(x))


def test_forward_matches_reference():
    gt.random.manual_seed(0)
    model = POSITIONS["in_residual"](causal=True).eval()
    x, _ = batch()
    expected, _ = layer_forward(model, x.astype(np.float64), params_of(model))
    np.testing.assert_allclose(model(x), expected, rtol=1e-5, atol=1e-6)


def test_state_dict_names_and_shapes():
    model = nn.Sequential(nn.Residual(nn.LayerNorm(EMBED), mha()), mha(bias=False))
    shapes = {name: value.shape for name, value in model.state_dict().items()}
    assert shapes == {
        "0.block.0.weight": (EMBED,), "0.block.0.bias": (EMBED,),
        "0.block.1.in_proj.weight": (3 * EMBED, EMBED), "0.block.1.in_proj.bias": (3 * EMBED,),
        "0.block.1.out_proj.weight": (EMBED, EMBED), "0.block.1.out_proj.bias": (EMBED,),
        "1.in_proj.weight": (3 * EMBED, EMBED), "1.out_proj.weight": (EMBED, EMBED),
    }
    restored = nn.Sequential(nn.Residual(nn.LayerNorm(EMBED), mha()), mha(bias=False))
    restored.load_state_dict(model.state_dict())
    x, _ = batch()
    np.testing.assert_array_equal(restored(x), model(x))


def test_memory_plan_equals_what_the_model_allocates():
    gt.random.manual_seed(0)
    model = POSITIONS["block"](causal=True)
    plan = model.compiled.plan((BATCH, SEQ, EMBED))
    x, y = batch()
    before = gt.memory_stats("cpu")["allocated_bytes"]
    gt.TrainStep(model, nn.CrossEntropyLoss())(x, y)
    assert model.compiled.current_plan == plan
    planned = sum(plan[k] for k in ("activations", "recompute", "backward_scratch", "loss_buffers", "workspace"))
    assert gt.memory_stats("cpu")["allocated_bytes"] - before == planned
    assert plan["workspace"] > 0


def test_tiny_transformer_learns_to_copy_the_previous_token():
    """Inputs: one-hot token and one-hot position; target: the token one position back (position 0:
    its own). Only attention can move a token to the next position, so the loss must fall from
    ln(vocab) to near 0."""
    vocab, seq, embed = 6, 8, 32
    gt.random.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(vocab + seq, embed),
        nn.Residual(nn.Sequential(nn.LayerNorm(embed), nn.MultiheadAttention(embed, 4, causal=True))),
        nn.Residual(nn.Sequential(nn.LayerNorm(embed), nn.Linear(embed, 2 * embed), nn.GELU(),
                                  nn.Linear(2 * embed, embed))),
        nn.LayerNorm(embed), nn.Linear(embed, vocab))
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), AdamW(model.parameters(), lr=1e-2))
    rng = np.random.default_rng(0)
    eye_tok, eye_pos = np.eye(vocab, dtype=np.float32), np.eye(seq, dtype=np.float32)
    losses = []
    for _ in range(150):
        tokens = rng.integers(0, vocab, (32, seq))
        x = np.concatenate([eye_tok[tokens], np.broadcast_to(eye_pos, (32, seq, seq))], -1)
        y = np.concatenate([tokens[:, :1], tokens[:, :-1]], 1)
        losses.append(step(x, y).loss)
    assert losses[0] > 0.8 * np.log(vocab)
    assert np.mean(losses[-10:]) < 0.1


def test_bad_configuration_and_inputs_raise():
    with pytest.raises(ValueError, match="embed_dim must be divisible by num_heads"):
        nn.MultiheadAttention(10, 3)
    with pytest.raises(ValueError, match="dropout probability"):
        nn.MultiheadAttention(8, 2, dropout=1.5)
    layer = mha()
    with pytest.raises(ValueError, match=r"takes \(batch, seq, embed_dim\) inputs, but gets 2"):
        layer(np.zeros((4, EMBED), np.float32))
    with pytest.raises(ValueError, match="expected 8 features"):
        layer(np.zeros((2, 3, 5), np.float32))
    x, _ = batch()
    assert layer(x).shape == x.shape  # the failures left the layer usable


@pytest.mark.cuda
@pytest.mark.parametrize("precision, tol", [("fp32", 1e-4), ("bf16", 6e-2)])
def test_a_transformer_block_on_cuda_steps_as_on_the_cpu(precision, tol):
    """The CUDA attention op gives the CPU op's bits (tests/test_cuda_attention.py); the model's
    GEMMs do not (cuBLAS), so the loss and gradients of a step agree within a tolerance."""
    gt.backends.set_tf32(False)
    x, y = batch()
    results = []
    for device in ("cpu", "cuda"):
        gt.random.manual_seed(5)
        model = nn.Sequential(lin(), pre_ln_block(causal=True, dropout=0.1), lin(EMBED, CLASSES)).to(device)
        step = gt.TrainStep(model, nn.CrossEntropyLoss(), None, precision=precision,
                            micro_batches=3)
        results.append((step(x, y).loss, model.compiled.read_gradients()))
    (cpu_loss, cpu_grads), (gpu_loss, gpu_grads) = results
    assert gpu_loss == pytest.approx(cpu_loss, rel=tol)
    assert np.max(np.abs(gpu_grads - cpu_grads)) <= tol * np.max(np.abs(cpu_grads))


def test_thread_count_changed_after_planning_keeps_the_bits():
    """The workspace has one slot per thread of the plan; more threads later use only those slots
    (never beyond the workspace), fewer use fewer: the results are the same bits either way."""
    ref.assert_thread_counts_keep_the_bits(lambda: (POSITIONS["block"](causal=True), *batch()),
                                           [(1, 1), (1, 3), (3, 1)])


def test_micro_batches_draw_the_full_batchs_dropout_masks():
    """Micro-batch m offsets its probability indices by m * (its B * H * T * T), so the masks of
    a step split into micro-batches are those of the whole batch at once: the gradients agree."""
    x, y = np.concatenate([batch(1)[0]] * 2), np.concatenate([batch(1)[1]] * 2)
    x[BATCH:] *= -1  # two different halves
    grads = []
    for steps in (1, 2):
        gt.random.manual_seed(0)
        model = POSITIONS["block"](dropout=0.4, causal=True)
        gt.TrainStep(model, nn.CrossEntropyLoss(), micro_batches=steps)(x, y)
        grads.append([p.grad.copy() for p in model.parameters()])
    for whole, split in zip(*grads):
        np.testing.assert_allclose(split, whole, rtol=1e-4, atol=1e-6)


@pytest.mark.sim
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_transformer_block_on_the_simulated_device_trains_as_on_the_cpu(precision):
    # The sim op table runs the CPU attention on its stream worker: the same bits as the CPU.
    def train(device):
        gt.random.manual_seed(5)
        model = nn.Sequential(lin(), pre_ln_block(causal=True, dropout=0.1), lin(EMBED, CLASSES)).to(device)
        optimizer = AdamW.for_model(model, lr=1e-2)
        step = gt.TrainStep(model, nn.CrossEntropyLoss(), optimizer, precision=precision,
                            micro_batches=3)
        losses = [step(*batch(seed)).loss for seed in range(3)]
        return losses, model.compiled.read_parameters()

    (cpu_losses, cpu_params), (sim_losses, sim_params) = train("cpu"), train("sim")
    assert sim_losses == cpu_losses
    np.testing.assert_array_equal(sim_params, cpu_params)

"""gputrain.models.GPT: one training step's loss and gradients against the float64 NumPy reference
of the whole model (tests/_gpt_reference.py; the tied token embedding's gradient is the sum of
both uses), GPT-2's initialisation, training in fp32/bf16, dropout, per-block checkpointing,
Hugging Face names in and out, generate with its key/value cache against full recomputes, the
sim device, and the memory plan of a Trainer step."""

from __future__ import annotations

import math

import numpy as np
import pytest

import _gpt_reference as gref
import _reference as ref
import gputrain as gt
from gputrain.models import GPT, GPTConfig
from gputrain.optim import AdamW

nn = gt.nn
SIZES = dict(vocab_size=23, block_size=12, n_layer=2, n_head=2, n_embd=16)
GRAD_TOLERANCE = {"fp32": 2e-5, "bf16": 6e-2}


def make(seed=0, **overrides):
    gt.random.manual_seed(seed)
    return GPT(**{**SIZES, **overrides})


def batch(seed=1, rows=3, seq=10, vocab=SIZES["vocab_size"]):
    tokens = np.random.default_rng(seed).integers(0, vocab, (rows, seq + 1))
    return tokens[:, :-1], tokens[:, 1:]


def scaled_up(model, factor=8.0):
    """Larger weights than GPT-2's init, so every gradient is far from zero."""
    rng = np.random.default_rng(5)
    model.load_state_dict({k: v + factor * 0.02 * rng.standard_normal(v.shape) for k, v in model.state_dict().items()})
    return model


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_step_matches_the_float64_reference(bias, precision, checkpointing):
    model = scaled_up(make(bias=bias))
    x, y = batch()
    loss, _, expected, _ = gref.loss_and_grads(model.state_dict(), x, y, SIZES["n_layer"], SIZES["n_head"])
    out = gt.TrainStep(model, nn.CrossEntropyLoss(), precision=precision, gradient_checkpointing=checkpointing)(x, y)
    tolerance = GRAD_TOLERANCE[precision]
    assert out.loss == pytest.approx(loss, rel=tolerance)
    names = [name for name, _ in model.named_parameters()]
    assert sorted(names) == sorted(expected)
    for name, parameter in model.named_parameters():
        error = np.linalg.norm(parameter.grad - expected[name])
        assert error <= tolerance * np.linalg.norm(expected[name]) + 1e-7, f"{name}: off by {error:.3g}"


def test_tied_gradient_is_the_sum_of_both_uses():
    model = scaled_up(make())
    x, y = batch()
    _, _, expected, (lookup, head) = gref.loss_and_grads(model.state_dict(), x, y, SIZES["n_layer"], SIZES["n_head"])
    gt.TrainStep(model, nn.CrossEntropyLoss())(x, y)
    grad = model.wte.weight.grad
    scale = np.linalg.norm(expected["wte.weight"])
    assert np.linalg.norm(grad - (lookup + head)) <= 2e-5 * scale
    for part in (lookup, head):  # neither use alone is the gradient
        assert np.linalg.norm(grad - part) > 0.05 * scale
    assert [n for n, _ in model.named_parameters()].count("wte.weight") == 1
    assert "lm_head.weight" not in model.state_dict()


def test_forward_matches_the_reference_and_positions_past_t_get_no_gradient():
    model = scaled_up(make()).eval()
    x, y = batch(seq=7)
    _, logits, expected, _ = gref.loss_and_grads(model.state_dict(), x, y, SIZES["n_layer"], SIZES["n_head"])
    np.testing.assert_allclose(model(x), logits, rtol=1e-4, atol=1e-5)
    step = gt.TrainStep(model, nn.CrossEntropyLoss())
    step(*batch(seq=10))  # gradients in rows 0..9, then a step that writes them anew
    assert np.all(model.wpe.weight.grad[:10] != 0)
    step(x, y)
    assert np.all(model.wpe.weight.grad[7:] == 0) and np.all(model.wpe.weight.grad[:7] != 0)


def test_gpt2_initialisation():
    model = make(n_layer=4, n_embd=64, n_head=4, vocab_size=300, block_size=64)
    state = model.state_dict()
    residual = 0.02 / math.sqrt(2 * 4)
    for name, value in state.items():
        if name.endswith("bias"):
            assert np.all(value == 0), name
        elif "ln_" in name:
            assert np.all(value == 1), name
        else:
            expected = residual if name.endswith(("out_proj.weight", "c_proj.weight")) else 0.02
            assert value.std() == pytest.approx(expected, rel=0.1), name
            assert abs(value.mean()) < 0.2 * expected, name
    again = make(n_layer=4, n_embd=64, n_head=4, vocab_size=300, block_size=64).state_dict()
    assert all(np.array_equal(state[k], again[k]) for k in state)  # the global seed decides


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_small_gpt_learns_a_repeating_sequence(precision):
    model = make(dropout=0.1)
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), AdamW(model.parameters(), lr=1e-2), precision=precision)
    rng = np.random.default_rng(0)
    pattern = np.arange(SIZES["vocab_size"])
    losses = []
    for _ in range(120):
        starts = rng.integers(0, SIZES["vocab_size"], 8)
        tokens = pattern[(starts[:, None] + np.arange(11)) % SIZES["vocab_size"]]
        losses.append(step(tokens[:, :-1], tokens[:, 1:]).loss)
    assert losses[0] > 0.9 * np.log(SIZES["vocab_size"])
    assert np.mean(losses[-10:]) < 0.05 * np.log(SIZES["vocab_size"])


def test_dropout_is_active_in_training_and_off_in_eval():
    with_dropout, without = make(dropout=0.3), make()
    with_dropout.load_state_dict(without.state_dict())
    x, _ = batch()
    assert not np.allclose(with_dropout(x), without(x), atol=1e-4)
    with_dropout.eval()
    np.testing.assert_allclose(with_dropout(x), without(x), rtol=1e-6, atol=1e-6)


def test_checkpointed_blocks_give_the_same_bits_with_dropout():
    """Each residual branch of each block keeps only its input and is re-run in backward with the
    same dropout keys: the gradients are those of the plain step, bit for bit, in less memory."""
    x, y = batch()
    grads, plans = [], []
    for checkpointing in (False, True):
        model = make(dropout=0.2)
        out = gt.TrainStep(model, nn.CrossEntropyLoss(), gradient_checkpointing=checkpointing)(x, y)
        grads.append((out.loss, [p.grad.copy() for p in model.parameters()]))
        plans.append(model.compiled.plan(x.shape, checkpointing=checkpointing))
    assert grads[0][0] == grads[1][0]
    assert all(ref.same_bits(a, b) for a, b in zip(grads[0][1], grads[1][1]))
    assert plans[1]["activations"] + plans[1]["recompute"] < plans[0]["activations"]


# -- Hugging Face names ------------------------------------------------------------------------


def test_hf_round_trip_and_conv1d_transposes():
    model = scaled_up(make())
    hf = model.to_hf_state_dict()
    own = model.state_dict()
    assert hf["transformer.h.1.attn.c_attn.weight"].shape == (16, 48)
    np.testing.assert_array_equal(hf["transformer.h.1.attn.c_attn.weight"], own["h.1.attn.in_proj.weight"].T)
    np.testing.assert_array_equal(hf["transformer.h.0.mlp.c_proj.weight"], own["h.0.mlp.c_proj.weight"].T)
    np.testing.assert_array_equal(hf["lm_head.weight"], own["wte.weight"])
    loaded = GPT.from_hf_state_dict(hf, n_head=2)
    assert loaded.config == model.config
    assert all(np.array_equal(v, loaded.state_dict()[k]) for k, v in own.items())
    x, _ = batch()
    np.testing.assert_array_equal(loaded.eval()(x), model.eval()(x))


def test_hf_gpt2model_names_and_mask_buffers_are_accepted():
    model = make(bias=False)
    hf = model.to_hf_state_dict()
    bare = {k.removeprefix("transformer."): v for k, v in hf.items() if k != "lm_head.weight"}
    bare["h.0.attn.bias"] = np.tril(np.ones((1, 1, 12, 12)))
    bare["h.1.attn.masked_bias"] = np.array(-1e4)
    loaded = GPT.from_hf_state_dict(bare, n_head=2, block_size=8)
    assert loaded.config == GPTConfig(**{**SIZES, "block_size": 8, "bias": False})
    np.testing.assert_array_equal(loaded.wpe.weight.data, model.wpe.weight.data[:8])


def test_hf_errors_name_the_key_and_change_nothing():
    model = make()
    before = model.state_dict()
    hf = model.to_hf_state_dict()
    missing = {k: v for k, v in hf.items() if k != "transformer.h.1.ln_2.bias"}
    with pytest.raises(KeyError, match=r"missing key 'transformer\.h\.1\.ln_2\.bias'"):
        model.load_hf_state_dict(missing)
    with pytest.raises(KeyError, match=r"unexpected key 'transformer\.h\.2\.ln_1\.weight'"):
        model.load_hf_state_dict({**hf, "transformer.h.2.ln_1.weight": np.ones(16)})
    wrong = {**hf, "transformer.h.0.attn.c_attn.weight": hf["transformer.h.0.attn.c_attn.weight"].T}
    with pytest.raises(ValueError, match=r"c_attn\.weight'\]: expected shape \(16, 48\), got \(48, 16\)"):
        model.load_hf_state_dict(wrong)
    with pytest.raises(ValueError, match="lm_head.weight'.*differs"):
        model.load_hf_state_dict({**hf, "lm_head.weight": hf["lm_head.weight"] + 1})
    with pytest.raises(ValueError, match="NaN"):
        model.load_hf_state_dict({**hf, "transformer.ln_f.bias": np.full(16, np.nan)})
    with pytest.raises(KeyError, match="missing key 'transformer.wte.weight'"):
        GPT.from_hf_state_dict({}, n_head=2)
    with pytest.raises(ValueError, match="n_head: required"):  # never guessed from n_embd
        GPT.from_hf_state_dict(hf)
    after = model.state_dict()
    assert all(np.array_equal(before[k], after[k]) for k in before)


def test_a_safetensors_path_needs_the_package(tmp_path):
    try:
        import safetensors.numpy as st
    except ImportError:
        with pytest.raises(ImportError, match="dict of NumPy arrays"):
            GPT.from_hf_state_dict(tmp_path / "model.safetensors")
        return
    model = make()
    path = tmp_path / "model.safetensors"
    st.save_file({k: np.ascontiguousarray(v) for k, v in model.to_hf_state_dict().items()
                  if k != "lm_head.weight"}, str(path))
    loaded = GPT.from_hf_state_dict(path, n_head=2)
    assert all(np.array_equal(v, loaded.state_dict()[k]) for k, v in model.state_dict().items())


# -- generate ---------------------------------------------------------------------------------


@pytest.mark.parametrize("new", [5, 20], ids=["inside_block", "past_block_size"])
def test_greedy_generation_with_the_cache_equals_full_recomputes(new):
    model = scaled_up(make(), factor=20.0)
    prompt = batch(rows=2, seq=4)[0]
    cached = model.generate(prompt, new, temperature=0)
    recomputed = model.generate(prompt, new, temperature=0, use_cache=False)
    assert cached.shape == (2, 4 + new)
    np.testing.assert_array_equal(cached, recomputed)
    np.testing.assert_array_equal(cached[:, :4], prompt)
    assert len(set(cached[0, 4:].tolist())) > 1  # not a constant continuation


def test_cached_logits_equal_the_models_forward():
    from gputrain.models.gpt import _CachedGPT

    model = scaled_up(make()).eval()
    tokens = batch(rows=2, seq=12)[0]
    cache = _CachedGPT(model)
    full = model(tokens)
    for t in range(3, 13):  # the prompt of 3 at once, then one token per step
        np.testing.assert_allclose(cache(tokens[:, :t]), full[:, t - 1], rtol=1e-4, atol=1e-4)
    assert cache.length == 12


def test_sampling_is_deterministic_for_a_seed_and_respects_top_k():
    model = scaled_up(make(), factor=20.0)
    prompt = np.array([1, 2, 3])
    a = model.generate(prompt, 15, temperature=1.5, top_k=5, seed=7, do_sample=True)
    assert a.shape == (18,)
    np.testing.assert_array_equal(a, model.generate(prompt, 15, temperature=1.5, top_k=5, seed=7, do_sample=True))
    np.testing.assert_array_equal(a, model.generate(prompt, 15, temperature=1.5, top_k=5, seed=7, use_cache=False,
                                                    do_sample=True))
    assert not np.array_equal(a, model.generate(prompt, 15, temperature=1.5, top_k=5, seed=8, do_sample=True))
    np.testing.assert_array_equal(model.generate(prompt, 15, top_k=1, seed=3, do_sample=True),
                                  model.generate(prompt, 15, temperature=0))
    np.testing.assert_array_equal(model.generate(prompt, 15, temperature=1.5, seed=3),  # greedy by default
                                  model.generate(prompt, 15, temperature=0))


def test_generate_checks_its_arguments():
    model = make()
    with pytest.raises(ValueError, match=r"tokens must be in \[0, 23\)"):
        model.generate([1, 23], 2)
    with pytest.raises(TypeError, match="integer ids"):
        model.generate([1.0, 2.0], 2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        model.generate([1], -1)
    with pytest.raises(ValueError, match="temperature"):
        model.generate([1], 1, temperature=-1)
    with pytest.raises(ValueError, match="top_k"):
        model.generate([1], 1, top_k=0)
    assert model.training  # use_cache=False switches to eval for its forwards and back
    model.generate([1], 2, use_cache=False)
    assert model.training


def test_bad_configuration_raises():
    with pytest.raises(ValueError, match="n_embd must be divisible by n_head"):
        GPT(**{**SIZES, "n_head": 3})
    with pytest.raises(TypeError, match="unexpected argument"):
        GPT(n_embed=16)
    with pytest.raises(ValueError, match="dropout"):
        GPT(**SIZES, dropout=1.0)
    model = make()
    with pytest.raises(ValueError, match="a sequence of 13 positions does not fit"):
        model(np.zeros((1, 13), np.int64))
    assert model(np.zeros((1, 12), np.int64)).shape == (1, 12, 23)


# -- devices and memory -----------------------------------------------------------------------


@pytest.mark.sim
def test_training_on_sim_is_bit_identical_to_the_cpu():
    results = []
    for device in ("cpu", "sim"):
        model = make(dropout=0.1).to(device)
        step = gt.TrainStep(model, nn.CrossEntropyLoss(), AdamW.for_model(model, lr=1e-2), gradient_checkpointing=True)
        losses = [step(*batch(seed=s)).loss for s in range(3)]
        results.append((losses, model.compiled.read_parameters()))
    assert results[0][0] == results[1][0]
    np.testing.assert_array_equal(results[0][1], results[1][1])


@pytest.mark.parametrize("config", [{}, {"bf16": True, "gradient_checkpointing": True}], ids=["fp32", "bf16_ckpt"])
def test_trainer_memory_plan_equals_the_allocators_peak(tmp_path, config):
    import gc

    x, y = batch(rows=32)
    args = gt.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8, learning_rate=1e-3,
                                save_strategy="no", disable_tqdm=True, seed=3, device="cpu", max_steps=2, **config)
    gc.collect()
    gc.disable()
    try:
        base = gt.memory_stats("cpu")["reserved_bytes"]
        model = make(dropout=0.1)
        gt.reset_peak_memory_stats("cpu")  # the layers compiled one by one before the GPT: not the run's
        trainer = gt.Trainer(model, args, train_dataset=(x, y))
        plan = trainer.memory_plan()
        trainer.train()
        growth = gt.memory_stats("cpu")["peak_reserved_bytes"] - base
    finally:
        gc.enable()
    assert trainer.state.global_step == 2
    assert growth == plan.total("cpu"), str(plan)


# -- the layers GPT adds to gputrain.nn -------------------------------------------------------


def test_position_embedding_and_tied_linear_in_a_sequential():
    gt.random.manual_seed(0)
    embedding = nn.Embedding(11, 8)
    model = nn.Sequential(embedding, nn.PositionEmbedding(6, 8), nn.TiedLinear(embedding))
    assert list(model.state_dict()) == ["0.weight", "1.weight"]
    ids = np.random.default_rng(0).integers(0, 11, (2, 5))
    table, positions = model.state_dict().values()
    hidden = table[ids] + positions[:5]
    np.testing.assert_allclose(model(ids), hidden @ table.T, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"a sequence of 7 positions does not fit layer '1' \(PositionEmbedding\(6, 8\)\)"):
        model(np.zeros((2, 7), np.int64))
    with pytest.raises(ValueError, match=r"takes \(\.\.\., seq, embedding_dim\) inputs, but gets 1"):
        nn.PositionEmbedding(6, 8)(np.zeros(8, np.float32))
    assert model(ids).shape == (2, 5, 11)  # the failures left it usable


def test_tied_linear_needs_its_embedding_before_it():
    embedding = nn.Embedding(11, 8)
    with pytest.raises(ValueError, match="its Embedding must be a layer of the same model, placed before it"):
        nn.Sequential(nn.Linear(8, 8), nn.TiedLinear(embedding))
    with pytest.raises(TypeError, match="must be a gputrain.nn.Embedding"):
        nn.TiedLinear(nn.Linear(8, 11))


def test_deepcopy_and_pickle_keep_the_weights_and_the_tying():
    import copy
    import pickle

    model = scaled_up(make(dropout=0.1))
    x, y = batch()
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert clone.config == model.config and clone.lm_head.embedding is clone.wte
        np.testing.assert_array_equal(clone.eval()(x), model.eval()(x))
        gt.TrainStep(clone.train(), nn.CrossEntropyLoss())(x, y)
        assert np.any(clone.wte.weight.grad != 0) and model.wte.weight.grad is None  # its own arenas


def test_a_tiny_temperature_samples_the_most_likely_token():
    model = scaled_up(make(), factor=20.0)
    prompt = np.array([4, 5])
    np.testing.assert_array_equal(model.generate(prompt, 6, temperature=1e-30, seed=0, do_sample=True),
                                  model.generate(prompt, 6, temperature=0))

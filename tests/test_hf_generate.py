"""gputrain.models.hf.generation.generate against transformers' own generate (the committed
fixtures: tests/fixtures/make_hf_fixtures.py's greedy continuation per family, and
make_hf_generate_fixtures.py's batched left-padded prompts, EOS stopping and sampling warpers),
against the float64 NumPy reference forward (the KV-cache path's logits), and its own promises:
a batched row gives the tokens of that row alone, seeds reproduce, top_k=1 is greedy, bad
arguments raise naming them."""

from __future__ import annotations

import functools
import os
import sys

import numpy as np
import pytest

from gputrain.models.hf.decoders import load_decoder_config
from gputrain.models.hf.generation import (KVCache, Sampling, _check_params, _draw, _warp, expected_params, forward,
                                           generate, next_tokens, prompt_positions)
from gputrain.models.hf.safetensors_io import checkpoint_tensors, read_tensor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _llama_reference as ref  # noqa: E402

HF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "hf")
FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "gemma", "gemma3")
BATCHED = os.path.join(HF, "generate-batched.npz")


@functools.lru_cache(maxsize=None)
def model(family: str):
    folder = os.path.join(HF, family + "-tiny")
    params = {name: read_tensor(tensor) for name, tensor in checkpoint_tensors(folder).items()}
    return load_decoder_config(folder), params


def test_every_fixture_folder_has_a_generate_reference():
    folders = sorted(f[:-len("-tiny.npz")] for f in os.listdir(HF) if f.endswith("-tiny.npz")
                     and "generate/prompt" in np.load(os.path.join(HF, f)).files)
    assert folders == sorted(FAMILIES)


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_matches_transformers_fixture(family):
    config, params = model(family)
    expected = np.load(os.path.join(HF, family + "-tiny.npz"))
    prompt, output = expected["generate/prompt"], expected["generate/output"]
    got = generate(config, params, prompt, output.shape[1] - prompt.shape[1], pad_token_id=0)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, output)


@pytest.mark.parametrize("family", FAMILIES)
def test_left_padded_batch_and_eos_match_transformers(family):
    config, params = model(family)
    data = np.load(BATCHED)
    ids, mask = data[f"{family}/input_ids"], data[f"{family}/attention_mask"]
    greedy = generate(config, params, ids, 20, attention_mask=mask, pad_token_id=0)
    np.testing.assert_array_equal(greedy, data[f"{family}/greedy"])
    stopped = generate(config, params, ids, 20, attention_mask=mask, pad_token_id=0,
                       eos_token_id=data[f"{family}/eos_token_id"].tolist())
    np.testing.assert_array_equal(stopped, data[f"{family}/eos_output"])
    # without a mask, transformers infers it from the pad token (0 here, and no prompt token is 0)
    np.testing.assert_array_equal(generate(config, params, ids, 20, pad_token_id=0), data[f"{family}/greedy"])


@pytest.mark.parametrize("case", "abcd")
def test_warpers_match_transformers(case):
    data = np.load(BATCHED)
    temperature, top_k, top_p = {"a": (0.7, 10, 0.9), "b": (1.3, None, 0.5), "c": (1.0, 3, None),
                                 "d": (2.0, None, 0.0)}[case]
    got = _warp(data["warp/logits"], Sampling(True, temperature, top_k, top_p))
    expected = data[f"warp/{case}"]
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(expected))
    np.testing.assert_array_equal(got[np.isfinite(expected)], expected[np.isfinite(expected)])


def relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("family", FAMILIES)
def test_cached_logits_match_the_full_reference_forward(family):
    """The prompt at once, then one token at a time against the cache, give the float64
    reference's logits of the whole sequence (positions past the sliding windows included)."""
    config, params = model(family)
    weights = _check_params(config, params)
    ids = np.random.default_rng(3).integers(3, config.vocab_size, (2, 14))
    mask = np.ones_like(ids)
    expected = ref.causal_lm_logits(config, {k: v.astype(np.float64) for k, v in params.items()}, ids, mask)
    cache = KVCache(config, 2, 14)
    assert cache.keys[0].shape == cache.values[-1].shape == (2, config.num_kv_heads, 14, config.head_dim)
    positions = prompt_positions(mask)
    got = [forward(config, weights, ids[:, :6], positions[:, :6], mask, cache, 0, all_logits=True)]
    for t in range(6, 14):
        got.append(forward(config, weights, ids[:, t:t + 1], positions[:, t:t + 1], mask, cache, t)[:, None])
    assert relative(np.concatenate(got, axis=1), expected) < 1e-5


@pytest.mark.parametrize("family", ["llama", "mistral", "gemma3"])
def test_each_row_of_a_left_padded_batch_is_that_row_alone(family):
    config, params = model(family)
    rng = np.random.default_rng(11)
    prompts = [rng.integers(3, config.vocab_size, n) for n in (7, 3, 5)]
    width = max(len(p) for p in prompts)
    ids = np.zeros((3, width), np.int64)
    mask = np.zeros((3, width), np.int64)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = prompt
        mask[row, width - len(prompt):] = 1
    batched = generate(config, params, ids, 12, attention_mask=mask)
    for row, prompt in enumerate(prompts):
        alone = generate(config, params, prompt[None], 12)
        np.testing.assert_array_equal(batched[row, width:], alone[0, len(prompt):])


def test_eos_finishes_rows_and_stops_when_all_finish():
    config, params = model("mistral")
    rng = np.random.default_rng(2)
    ids = rng.integers(3, config.vocab_size, (2, 5))
    free = generate(config, params, ids, 10)
    assert free.shape == (2, 15)
    eos = int(free[0, 7])  # row 0's third new token
    assert eos not in free[0, 5:7], "the test wants an EOS that row 0 does not produce at once"
    first = {row: next((t for t in range(5, 15) if free[row, t] == eos), None) for row in (0, 1)}
    stopped = generate(config, params, ids, 10, eos_token_id=eos, pad_token_id=1)
    for row in (0, 1):
        end = first[row]
        if end is None:
            np.testing.assert_array_equal(stopped[row], free[row, :stopped.shape[1]])
        else:  # the row's tokens up to its EOS, then the pad token
            np.testing.assert_array_equal(stopped[row, :end + 1], free[row, :end + 1])
            assert (stopped[row, end + 1:] == 1).all()
    if all(end is not None for end in first.values()):
        assert stopped.shape[1] == max(first.values()) + 1
    one = generate(config, params, ids[:1], 10, eos_token_id=[eos])  # pad defaults to the EOS id
    np.testing.assert_array_equal(one[0], free[0, :first[0] + 1])


def test_single_prompt_rank_one():
    config, params = model("qwen3")
    prompt = np.array([5, 9, 14, 30])
    out = generate(config, params, prompt, 4)
    assert out.shape == (8,)
    np.testing.assert_array_equal(out, generate(config, params, prompt[None], 4)[0])


def test_sampling_is_reproducible_and_top_k_1_is_greedy():
    config, params = model("gemma")
    ids = np.random.default_rng(4).integers(3, config.vocab_size, (2, 4))
    greedy = generate(config, params, ids, 12)
    first = generate(config, params, ids, 12, do_sample=True, temperature=3.0, seed=7)
    again = generate(config, params, ids, 12, do_sample=True, temperature=3.0, seed=7)
    other = generate(config, params, ids, 12, do_sample=True, temperature=3.0, seed=8)
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)
    assert not np.array_equal(first, greedy)
    np.testing.assert_array_equal(generate(config, params, ids, 12, do_sample=True, top_k=1, seed=3), greedy)
    np.testing.assert_array_equal(generate(config, params, ids, 12, do_sample=False, temperature=5.0, top_k=3),
                                  greedy)


def test_samples_come_from_the_warped_support():
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((64, 40)) * 2).astype(np.float32)
    for top_k, top_p in ((3, None), (None, 0.3), (5, 0.6)):
        sampling = Sampling(True, 0.8, top_k, top_p)
        allowed = np.isfinite(_warp(logits, sampling))
        draws = np.stack([next_tokens(logits, sampling, rng) for _ in range(20)], axis=1)
        assert np.take_along_axis(allowed, draws, axis=1).all(), (top_k, top_p)
    # top_p 0 keeps only the most likely token
    only = next_tokens(logits, Sampling(True, 1.0, None, 0.0), rng)
    np.testing.assert_array_equal(only, logits.argmax(-1))


def test_draws_follow_the_probabilities():
    probs = np.tile(np.array([[0.5, 0.3, 0.2, 0.0]], np.float32), (20000, 1))
    counts = np.bincount(_draw(probs, np.random.default_rng(0)), minlength=4) / 20000
    np.testing.assert_allclose(counts, [0.5, 0.3, 0.2, 0.0], atol=0.015)  # ~4 standard deviations


def test_mask_inferred_from_the_pad_token_must_be_left_padding():
    config, params = model("llama")
    with pytest.raises(ValueError, match="inferred as input_ids != pad_token_id 0.*row 0 is not left-padded"):
        generate(config, params, [[5, 0, 6]], 2, pad_token_id=0)
    # a pad id that is also an EOS id infers nothing (transformers' rule): every token is attended to
    np.testing.assert_array_equal(generate(config, params, [[5, 0, 6]], 2, pad_token_id=0, eos_token_id=0)[0, :3],
                                  [5, 0, 6])


def test_params_are_checked_by_name():
    config, params = model("llama")
    assert set(expected_params(config)) == set(params)
    missing = dict(params)
    del missing["model.layers.1.mlp.up_proj.bias"]
    with pytest.raises(ValueError, match="model.layers.1.mlp.up_proj.bias.*missing"):
        generate(config, missing, [[5, 6]], 2)
    wrong = dict(params, **{"model.norm.weight": np.ones(3, np.float32)})
    with pytest.raises(ValueError, match=r"model.norm.weight.*\(3,\)"):
        generate(config, wrong, [[5, 6]], 2)
    with pytest.raises(ValueError, match="unexpected tensor 'extra'"):
        generate(config, dict(params, extra=np.ones(1)), [[5, 6]], 2)
    tied_config, tied = model("qwen2")
    with pytest.raises(ValueError, match="lm_head.weight.*ties"):
        generate(tied_config, dict(tied, **{"lm_head.weight": tied["model.embed_tokens.weight"]}), [[5, 6]], 2)
    with pytest.raises(TypeError, match="params"):
        generate(config, [1, 2], [[5, 6]], 2)
    with pytest.raises(TypeError, match="config"):
        generate({"model_type": "llama"}, params, [[5, 6]], 2)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(input_ids=[[1.5, 2.0]]), TypeError, "input_ids"),
    (dict(input_ids=[[1, 2], [3]]), ValueError, "input_ids"),
    (dict(input_ids=[[5, 96]]), ValueError, r"input_ids.*\[0, 96\)"),
    (dict(input_ids=np.zeros((1, 0), np.int64)), ValueError, "input_ids"),
    (dict(input_ids=np.zeros((1, 2, 2), np.int64)), ValueError, "input_ids"),
    (dict(max_new_tokens=0), ValueError, "max_new_tokens"),
    (dict(max_new_tokens=2.0), ValueError, "max_new_tokens"),
    (dict(attention_mask=[[1, 1, 1]]), ValueError, "attention_mask.*shape"),
    (dict(attention_mask=[[1, 0]]), ValueError, "attention_mask row 0 is not left-padded"),
    (dict(attention_mask=[[0, 0]]), ValueError, "attention_mask row 0 is all 0"),
    (dict(attention_mask=[[2, 1]]), ValueError, "attention_mask must hold only 0 and 1"),
    (dict(attention_mask=[[0.5, 1.0]]), TypeError, "attention_mask"),
    (dict(do_sample="yes"), TypeError, "do_sample"),
    (dict(temperature=0.0), ValueError, "temperature"),
    (dict(temperature=float("nan")), ValueError, "temperature"),
    (dict(top_k=-1), ValueError, "top_k"),
    (dict(top_k=2.5), ValueError, "top_k"),
    (dict(top_p=1.5), ValueError, "top_p"),
    (dict(eos_token_id=-1), ValueError, "eos_token_id"),
    (dict(eos_token_id=[]), ValueError, "eos_token_id"),
    (dict(eos_token_id=[2, 200]), ValueError, "eos_token_id"),
    (dict(pad_token_id=96), ValueError, "pad_token_id"),
    (dict(pad_token_id=[0]), ValueError, "pad_token_id"),
    (dict(seed=-3), ValueError, "seed"),
    (dict(seed="7"), ValueError, "seed"),
])
def test_bad_arguments_name_themselves(kwargs, error, match):
    config, params = model("llama")
    args = dict(input_ids=[[5, 6]], max_new_tokens=2)
    args.update(kwargs)
    with pytest.raises(error, match=match):
        generate(config, params, args.pop("input_ids"), args.pop("max_new_tokens"), **args)


def test_inputs_are_not_modified():
    config, params = model("mistral")
    ids = np.array([[0, 7, 8], [9, 10, 11]])
    mask = np.array([[0, 1, 1], [1, 1, 1]])
    before = {k: v.copy() for k, v in params.items()}
    generate(config, params, ids, 3, attention_mask=mask, do_sample=True, top_p=0.8, seed=1)
    np.testing.assert_array_equal(ids, [[0, 7, 8], [9, 10, 11]])
    np.testing.assert_array_equal(mask, [[0, 1, 1], [1, 1, 1]])
    assert all(np.array_equal(before[k], params[k]) for k in params)

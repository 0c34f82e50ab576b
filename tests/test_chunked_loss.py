"""The chunked LM head + cross-entropy (TrainStep's loss_chunk_rows, csrc/nn/head_loss.c): the
training step never holds a whole micro-batch's logits, only loss_chunk_rows x vocabulary of them.

What is compared with the unchunked step (loss_chunk_rows=0) on the Hugging Face fixtures (GPT-2
and Llama untied, Qwen2 tied to the token embedding; right padding, so the shifted labels hold
ignore_index rows), in f32 and bf16:
- the loss and every gradient but the head's weight: bit-identical whenever each block has at
  least 16 rows (or is the whole micro-batch). The per-row softmax-xent is the same code with the
  same count, and dX reduces over the vocabulary, which blocks of rows do not split; the bits of a
  row of the logits and of dX are then those of the CPU library's GEMM for that number of rows, and
  oneDNN's kernels for fewer than 16 rows sum in another order (1 ulp here and there: the blocks of
  1 and 7 rows are checked to 1e-6 relative on the loss, 1e-5 on the gradients, not to the bit).
  On an AVX2-only CPU (qemu's Haswell) oneDNN's f32 kernels give a row bits that depend on its
  place in the block (rows 24-31 of 32 take a tail kernel), so the small classifier below asks the
  GEMM library first (gemm_rows_keep_their_bits) and holds the chunked step to rounding there;
- the head's weight gradient (the token embedding's when tied): within f32 rounding of the
  unchunked one (the blocks split that GEMM's reduction over rows).
The simulated device gives the CPU's bits; its allocator peaks at the plan, which is smaller by
the logits' bytes. A soft-capped head (Gemma 3), a negative size or a non-cross-entropy loss are
refused, naming loss_chunk_rows, with nothing changed.
"""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest

import gputrain as gt
from gputrain import memory_plan as mp
from gputrain.models import from_pretrained

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "hf")
HEAD = {"gpt2": "lm_head.weight", "llama": "lm_head.weight", "qwen2": "model.embed_tokens.weight"}
ALIGN = 64  # GT_ALIGN: every planned piece starts on this boundary


def gemm_rows_keep_their_bits(rows, block, n, k):
    """Whether the CPU's f32 GEMM (rows x k) @ (k x n) gives every row the same bits when run in
    blocks of `block` rows: what the chunked head's input gradient needs to be bit-identical."""
    from gputrain import _C_testing

    def gemm(a, b):
        c = np.zeros((a.shape[0], n), np.float32)
        _C_testing.run_op("cpu", "gemm", [a, b, c], (False, False, a.shape[0], n, k, 1.0, "f32", k, "f32", n, 0.0,
                                                      "f32", n, 1, 0, 0, 0))
        return c

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((rows, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    blocks = [gemm(a[i:i + block].copy(), b) for i in range(0, rows, block)]
    return np.array_equal(np.concatenate(blocks), gemm(a, b))


def batch(family):
    """(model, (ids, targets), attention_mask) of a fixture: 3 sequences of 16 tokens (48 rows)."""
    model = from_pretrained(os.path.join(FIXTURES, f"{family}-tiny"))
    ref = np.load(os.path.join(FIXTURES, f"{family}-tiny.npz"))
    if family == "gpt2":
        return model, (ref["input_ids"], ref["targets"]), None
    return model, (ref["right/input_ids"], model.shift_labels(ref["right/labels"])), ref["right/attention_mask"]


def train(family, chunk, precision="fp32", device="cpu", loss=None, micro_batches=1, steps=0):
    """One step's loss and gradients (steps=0: no optimizer), or `steps` AdamW steps' losses and
    the parameters."""
    model, (x, y), mask = batch(family)
    model.to(device)
    optimizer = gt.optim.AdamW.for_model(model, lr=1e-3) if steps else None
    step = gt.TrainStep(model, loss or gt.nn.CrossEntropyLoss(), optimizer, precision=precision,
                        micro_batches=micro_batches, loss_chunk_rows=chunk)
    kwargs = {} if mask is None else {"attention_mask": mask}
    if steps:
        losses = [step(x, y, **kwargs).loss for _ in range(steps)]
        return losses, model.compiled.read_parameters()
    out = step(x, y, **kwargs)
    return out.loss, {name: p.grad.copy() for name, p in model.named_parameters()}


def relative_error(actual, expected):
    return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("family", ["gpt2", "llama", "qwen2"])
def test_loss_and_input_gradients_are_the_unchunked_bits(family, precision):
    base_loss, base = train(family, 0, precision)
    for chunk in (16, 24, 48, 1000):  # blocks 16 x 3; 24 x 2; one block of all rows; more than the rows
        loss, grads = train(family, chunk, precision)
        assert loss == base_loss, chunk
        for name in base:
            if name != HEAD[family]:
                np.testing.assert_array_equal(grads[name], base[name], err_msg=f"{name}, chunk {chunk}")
            elif chunk >= 48:  # one block: the same GEMM
                np.testing.assert_array_equal(grads[name], base[name], err_msg=f"{name}, chunk {chunk}")
            else:
                assert relative_error(grads[name], base[name]) <= 1e-6, (name, chunk)


@pytest.mark.parametrize("family", ["gpt2", "qwen2"])
def test_blocks_of_fewer_rows_than_the_librarys_kernels_stay_within_rounding(family):
    base_loss, base = train(family, 0)
    for chunk in (1, 7):
        loss, grads = train(family, chunk)
        assert loss == pytest.approx(base_loss, rel=1e-6)
        for name in base:
            assert relative_error(grads[name], base[name]) <= 1e-5, (name, chunk)


def test_the_targets_hold_ignored_rows_and_label_smoothing_is_per_row():
    _, (_, y), _ = batch("llama")
    assert (y == -100).sum() > 0  # right padding: rows the loss skips
    smoothed = gt.nn.CrossEntropyLoss(label_smoothing=0.1)
    (base_loss, base), (loss, grads) = train("llama", 0, loss=smoothed), train("llama", 16, loss=smoothed)
    assert loss == base_loss
    np.testing.assert_array_equal(grads["model.norm.weight"], base["model.norm.weight"])


@pytest.mark.sim
@pytest.mark.parametrize("chunk", [7, 16])
def test_sim_gives_the_cpus_bits(chunk):
    """Two AdamW steps of 3 micro-batches (accumulated head gradients) on sim and on the CPU."""
    cpu = train("llama", chunk, "bf16", "cpu", micro_batches=3, steps=2)
    sim = train("llama", chunk, "bf16", "sim", micro_batches=3, steps=2)
    assert sim[0] == cpu[0]
    np.testing.assert_array_equal(sim[1], cpu[1])


def test_predict_after_a_chunked_step_returns_the_whole_logits():
    model, (x, y), _ = batch("gpt2")
    expected = model(x)
    gt.TrainStep(model, gt.nn.CrossEntropyLoss(), None, loss_chunk_rows=7)(x, y)
    assert model.compiled.loss_chunk_rows == 7
    np.testing.assert_array_equal(model(x), expected)
    assert model.compiled.current_plan["loss_buffers"] > 0


def aligned(n):
    return -(-n // ALIGN) * ALIGN


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_plan_drops_the_logits_and_keeps_one_block(precision):
    model, (x, y), _ = batch("gpt2")
    rows, vocab, width, size = x.size, 100, 64, 4 if precision == "fp32" else 2
    step = gt.TrainStep(model, gt.nn.CrossEntropyLoss(), None, precision=precision)
    whole = step.memory_plan(x.shape)
    model.compiled.loss_chunk_rows = 16
    chunked = step.memory_plan(x.shape)
    assert whole["activations"] - chunked["activations"] == aligned(rows * vocab * size)  # the logits
    # the loss buffers: the logits' gradient (rows, vocab) becomes the head input's (rows, width)
    # and one block (16, vocab)
    assert whole["loss_buffers"] - chunked["loss_buffers"] == (
        aligned(rows * vocab * size) - aligned(rows * width * size) - aligned(16 * vocab * size))
    assert chunked["backward_scratch"] <= whole["backward_scratch"]
    assert chunked["workspace"] <= whole["workspace"]
    assert whole["total"] - chunked["total"] == sum(whole[k] - chunked[k] for k in whole if k != "total")


@pytest.mark.sim
@pytest.mark.parametrize("chunk", [0, 7, 16])
def test_a_sim_step_peaks_at_its_plan(chunk):
    gc.collect()
    model, (x, y), mask = batch("llama")
    model.to("sim")
    gt.reset_peak_memory_stats("sim:0")
    step = gt.TrainStep(model, gt.nn.CrossEntropyLoss(), gt.optim.AdamW.for_model(model, lr=1e-3),
                        precision="bf16", micro_batches=3, loss_chunk_rows=chunk)
    plan = mp.plan_step(step, (x.shape[0], 3, x.shape[1]))  # ids, mask and position ids
    step(x, y, attention_mask=mask)
    assert gt.memory_stats("sim:0")["peak_reserved_bytes"] == plan.total("sim:0"), str(plan)
    assert plan.settings.get("loss_chunk_rows", 0) == chunk


def test_bad_settings_are_refused_naming_the_argument():
    model, _, _ = batch("gpt2")
    compiled = model.compiled
    with pytest.raises(ValueError, match="loss_chunk_rows: must be >= 0"):
        gt.TrainStep(model, gt.nn.CrossEntropyLoss(), loss_chunk_rows=-1)
    with pytest.raises(TypeError, match="loss_chunk_rows must be an int"):
        gt.TrainStep(model, gt.nn.CrossEntropyLoss(), loss_chunk_rows=2.0)
    with pytest.raises(ValueError, match="loss_chunk_rows=8: the chunked LM-head loss is a cross-entropy"):
        gt.TrainStep(model, gt.nn.MSELoss(), loss_chunk_rows=8)
    with pytest.raises(TypeError, match="loss_chunk_rows must be an int"):
        compiled.loss_chunk_rows = True
    assert compiled.loss_chunk_rows == 0
    gemma3 = from_pretrained(os.path.join(FIXTURES, "gemma3-tiny"))  # final_logit_softcapping: Scale, tanh, Scale
    with pytest.raises(ValueError, match=r"loss_chunk_rows: .* ends with layer .*soft-capped head"):
        gt.TrainStep(gemma3, gt.nn.CrossEntropyLoss(), loss_chunk_rows=8)
    assert gemma3.compiled.loss_chunk_rows == 0
    with pytest.raises(ValueError, match="loss_chunk_rows=8: R-Drop's loss"):
        gt.TrainStep(model, gt.nn.CrossEntropyLoss(), loss_chunk_rows=8, rdrop_alpha=1.0)
    assert compiled.loss_chunk_rows == 0
    with pytest.raises(ValueError, match="loss_chunk_rows must be >= 0"):
        gt.TrainingArguments(output_dir="unused", loss_chunk_rows=-4)


@pytest.mark.parametrize("layers", ["head only", "mlp"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_plain_classifier_head_with_a_bias(layers, precision):
    """A Linear with a bias (its gradient accumulated block by block), alone (it reads the model's
    input: no input gradient) or after other layers, over 3 micro-batches."""
    nn = gt.nn
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((96, 8)).astype(np.float32), rng.integers(0, 40, 96).astype(np.int64)
    y[::5] = -100
    results = []
    for chunk in (0, 16, 20):  # 20: blocks of 20, 12 (fewer than 16 rows: within rounding)
        gt.random.manual_seed(0)
        body = [] if layers == "head only" else [nn.Linear(8, 32), nn.GELU()]
        model = nn.Sequential(*body, nn.Linear(8 if layers == "head only" else 32, 40))
        step = gt.TrainStep(model, nn.CrossEntropyLoss(), None, precision=precision, micro_batches=3,
                            loss_chunk_rows=chunk)
        results.append((step(x, y).loss, [p.grad.copy() for p in model.parameters()]))
    (base_loss, base), (loss, grads), (loss20, grads20) = results
    assert loss20 == pytest.approx(base_loss, rel=1e-6) and loss == pytest.approx(base_loss, rel=1e-6)
    # The bits below the head are the GEMM library's: equal where its rows keep their bits in blocks of
    # 16 (this machine's oneDNN; not on an AVX2-only CPU, where the test holds them to rounding only).
    exact = gemm_rows_keep_their_bits(32, 16, 32, 40)
    if exact:
        assert loss == base_loss
    for i, (g, g20, b) in enumerate(zip(grads, grads20, base)):
        if i < len(base) - 2 and exact:  # the body's: from the head's input gradient
            np.testing.assert_array_equal(g, b)
        assert relative_error(g, b) <= 1e-6 and relative_error(g20, b) <= 1e-5


def test_the_trainer_passes_loss_chunk_rows_to_its_step_and_plan(tmp_path):
    """TrainingArguments(loss_chunk_rows=16) over packed rows: the same training loss as 0 (blocks of
    16 rows), SGD weights within rounding (the head's weight gradient), a smaller plan, and evaluate()
    still sees whole logits."""
    from gputrain.models.hf import decoder_models as dm

    config = {"model_type": "qwen3", "vocab_size": 40, "hidden_size": 32, "intermediate_size": 48, "head_dim": 8,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
    rng = np.random.default_rng(1)
    packed = gt.data.pack_sequences([rng.integers(0, 40, n) for n in (5, 9, 3, 12, 7, 6, 4, 10, 8, 11)], 16)
    runs = []
    for chunk in (0, 16):
        gt.random.manual_seed(3)
        model = dm.Qwen3ForCausalLM(config)
        args = gt.TrainingArguments(output_dir=str(tmp_path / str(chunk)), per_device_train_batch_size=2,
                                    max_steps=1, learning_rate=1e-2, optim="sgd", save_strategy="no", disable_tqdm=True,
                                    report_to="none", loss_chunk_rows=chunk)
        trainer = gt.Trainer(model=model, args=args, train_dataset=packed, eval_dataset=packed)
        plan = trainer.memory_plan()
        loss = trainer.train().training_loss
        runs.append((loss, model.compiled.read_parameters(), plan, trainer.evaluate()["eval_loss"]))
    (loss0, params0, plan0, eval0), (loss16, params16, plan16, eval16) = runs
    assert model.compiled.loss_chunk_rows == 16
    assert loss16 == loss0
    np.testing.assert_allclose(params16, params0, rtol=1e-6, atol=1e-9)
    assert plan16.total(plan16.device) < plan0.total(plan0.device)
    assert eval16 == pytest.approx(eval0, rel=1e-6)

"""gputrain.models.GPT against Hugging Face's GPT2LMHeadModel built from the same random weights:
logits and every parameter gradient of the mean next-token cross-entropy agree to 1e-4 (relative,
fp32). Needs torch and transformers, which CI does not install: skipped without them. To run it,
install transformers beside a torch environment without touching it, e.g.
``/work/venv-torch/bin/pip install --target /tmp/gpt-tf transformers`` and
``PYTHONPATH=python:/tmp/gpt-tf /work/venv-torch/bin/python -m pytest tests/test_gpt_hf.py``."""

from __future__ import annotations

import numpy as np
import pytest

import gputrain as gt
from gputrain.models import GPT

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SIZES = dict(vocab_size=97, n_positions=32, n_layer=3, n_head=4, n_embd=64)


def hf_model(seed=0):
    torch.manual_seed(seed)
    config = transformers.GPT2Config(**SIZES, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                     activation_function="gelu_new", layer_norm_epsilon=1e-5,
                                     bos_token_id=0, eos_token_id=0, attn_implementation="eager")
    model = transformers.GPT2LMHeadModel(config).float()
    with torch.no_grad():  # non-trivial LayerNorms and biases, so every parameter matters
        for name, p in model.named_parameters():
            if name.endswith("bias") or ".ln_" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def relative_error(actual, expected):
    return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))


def test_logits_and_gradients_match_gpt2lmheadmodel():
    reference = hf_model()
    weights = {k: v.detach().numpy().copy() for k, v in reference.state_dict().items()}
    model = GPT.from_hf_state_dict(weights, n_head=SIZES["n_head"])
    tokens = np.random.default_rng(0).integers(0, SIZES["vocab_size"], (4, 25))
    x, y = tokens[:, :-1], tokens[:, 1:]

    logits = reference(torch.from_numpy(x)).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, SIZES["vocab_size"]), torch.from_numpy(y).reshape(-1))
    loss.backward()
    assert relative_error(model.eval()(x), logits.detach().numpy()) < 1e-4

    out = gt.TrainStep(model.train(), gt.nn.CrossEntropyLoss())(x, y)
    assert out.loss == pytest.approx(loss.item(), rel=1e-5)
    expected = {k: p.grad.numpy() for k, p in reference.named_parameters()}
    grads = {name: p.grad for name, p in model.named_parameters()}
    checked = 0
    for name, hf, conv in model._hf_names():
        grad = grads[name].T if conv else grads[name]
        assert relative_error(grad, expected[hf]) < 1e-4, hf
        checked += 1
    assert checked == len(expected)  # lm_head.weight is transformer.wte.weight in torch too

"""gputrain.nn models: names, initialisation, forward/backward against a float64 NumPy
reference, state_dict, train/eval, and bad inputs."""

from __future__ import annotations

import numpy as np
import pytest

import gputrain as gt
from _mlp_reference import cross_entropy, layer_backward, layer_forward, params_of

nn = gt.nn


def mlp(activation=None, dropout=0.0):
    gt.random.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 32), activation or nn.GELU(), nn.Dropout(dropout), nn.Linear(32, 5))


def transformer_like():
    gt.random.manual_seed(1)
    block = nn.Residual(nn.LayerNorm(16), nn.Linear(16, 48), nn.GELU(approximate="tanh"), nn.Linear(48, 16))
    return nn.Sequential(nn.Linear(12, 16), block, nn.Residual(nn.LayerNorm(16), nn.Linear(16, 16), nn.SiLU()),
                         nn.LayerNorm(16), nn.Tanh(), nn.Linear(16, 5))


def without_biases():
    gt.random.manual_seed(2)
    return nn.Sequential(nn.Linear(12, 16, bias=False), nn.LayerNorm(16, bias=False), nn.ReLU(),
                         nn.Residual(nn.LayerNorm(16), nn.Linear(16, 16, bias=False)), nn.Linear(16, 5))


def test_parameter_names_and_shapes_follow_pytorch():
    model = mlp()
    shapes = {name: p.shape for name, p in model.named_parameters()}
    assert shapes == {"0.weight": (32, 12), "0.bias": (32,), "3.weight": (5, 32), "3.bias": (5,)}
    assert list(model.state_dict()) == list(shapes)
    assert model[0].weight is dict(model.named_parameters())["0.weight"]
    assert model.num_parameters() == 12 * 32 + 32 + 32 * 5 + 5
    names = [n for n, _ in transformer_like().named_parameters()]
    assert names[:6] == ["0.weight", "0.bias", "1.block.0.weight", "1.block.0.bias", "1.block.1.weight", "1.block.1.bias"]


def test_initialisation_follows_pytorch_defaults_and_the_seed():
    gt.random.manual_seed(3)
    model = nn.Sequential(nn.Linear(400, 300), nn.LayerNorm(300), nn.Embedding(50, 64))
    w = model[0].weight.data
    bound = 1 / np.sqrt(400)
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.99 * bound
    assert abs(w.mean()) < 0.01 * bound and abs(w.std() - bound / np.sqrt(3)) < 0.01 * bound
    assert np.all(model[1].weight.data == 1) and np.all(model[1].bias.data == 0)
    emb = model[2].weight.data
    assert abs(emb.mean()) < 0.03 and abs(emb.std() - 1) < 0.03
    gt.random.manual_seed(3)
    again = nn.Sequential(nn.Linear(400, 300), nn.LayerNorm(300), nn.Embedding(50, 64))
    for a, b in zip(model.parameters(), again.parameters()):
        assert np.array_equal(a.data, b.data)


@pytest.mark.parametrize("make", [lambda: mlp(nn.GELU()), lambda: mlp(nn.ReLU()), lambda: mlp(nn.Tanh()),
                                  lambda: mlp(nn.SiLU()), lambda: mlp(nn.GELU("tanh")), transformer_like])
def test_forward_matches_numpy(make):
    model = make().eval()
    x = np.random.default_rng(0).standard_normal((9, 12)).astype(np.float32)
    expected, _ = layer_forward(model, x.astype(np.float64), params_of(model))
    np.testing.assert_allclose(model(x), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("make", [mlp, transformer_like, without_biases])
def test_gradients_match_numpy(make):
    model = make()
    rng = np.random.default_rng(1)
    x = rng.standard_normal((16, 12)).astype(np.float32)
    y = rng.integers(0, 5, 16)
    out = gt.TrainStep(model, nn.CrossEntropyLoss())(x, y)
    params = params_of(model)
    logits, cache = layer_forward(model, x.astype(np.float64), params)
    loss, dlogits = cross_entropy(logits, y)
    grads = {}
    layer_backward(model, dlogits, cache, params, grads)
    assert out.loss == pytest.approx(loss, rel=1e-5)
    for module in model.modules():
        for name in module._param_names:
            parameter = module._params.get(name)
            if parameter is not None:
                np.testing.assert_allclose(parameter.grad, grads[id(module)][name], rtol=1e-5, atol=1e-6)


def test_mse_gradients_match_numpy():
    model = mlp()
    rng = np.random.default_rng(2)
    x = rng.standard_normal((8, 12)).astype(np.float32)
    y = rng.standard_normal((8, 5)).astype(np.float32)
    out = gt.TrainStep(model, nn.MSELoss())(x, y)
    params = params_of(model)
    pred, cache = layer_forward(model, x.astype(np.float64), params)
    assert out.loss == pytest.approx(((pred - y) ** 2).mean(), rel=1e-5)
    grads = {}
    layer_backward(model, 2 * (pred - y) / pred.size, cache, params, grads)
    np.testing.assert_allclose(model[0].weight.grad, grads[id(model[0])]["weight"], rtol=1e-5, atol=1e-6)


def test_state_dict_round_trip_and_errors():
    model, other = mlp(), mlp()
    for p in other.parameters():
        p.data[...] = 0.5
    model.load_state_dict(other.state_dict())
    assert all(np.all(p.data == 0.5) for p in model.parameters())
    state = model.state_dict()
    state["0.weight"][...] = 9  # a copy: the model is unchanged
    assert np.all(model[0].weight.data == 0.5)
    with pytest.raises(KeyError, match="missing"):
        model.load_state_dict({"0.weight": state["0.weight"]})
    bad = dict(state)
    bad["0.bias"] = np.zeros(7, np.float32)
    with pytest.raises(ValueError, match="0.bias"):
        model.load_state_dict(bad)


def test_eval_disables_dropout_and_train_enables_it():
    model = mlp(dropout=0.5)
    x = np.ones((4, 12), np.float32)
    model.eval()
    assert np.array_equal(model(x), model(x))
    reference = model(x)
    model.train()
    assert not np.allclose(model(x), reference)


def test_dropout_p1_zeroes_the_output_in_training_and_the_gradients_behind_it():
    # PyTorch accepts Dropout(1.0): zeros in training, identity in eval, zero gradients behind it.
    model = nn.Sequential(nn.Linear(12, 8), nn.Dropout(1.0), nn.Linear(8, 3))
    x = np.ones((4, 12), np.float32)
    assert np.all(model(x) == model[2].bias.data)
    gt.TrainStep(model, nn.CrossEntropyLoss())(x, np.zeros(4, np.int64))
    assert np.all(model[0].weight.grad == 0) and np.all(model[0].bias.grad == 0)
    assert np.all(model[2].weight.grad == 0) and np.any(model[2].bias.grad != 0)
    model.eval()
    assert not np.all(model(x) == model[2].bias.data)


def test_zero_grad_set_to_none_reads_none_without_touching_memory():
    model = mlp()
    gt.TrainStep(model, nn.CrossEntropyLoss())(np.ones((4, 12), np.float32), np.zeros(4, np.int64))
    grad = model[0].weight.grad
    assert grad is not None and np.abs(grad).sum() > 0
    before = grad.copy()
    model.zero_grad(set_to_none=True)
    assert model[0].weight.grad is None
    assert np.array_equal(model[0].weight._grad_storage, before)
    model.zero_grad(set_to_none=False)
    assert np.all(model[0].weight.grad == 0)


def test_summary_lists_layers_parameters_and_bytes():
    text = transformer_like().summary((32, 12))
    assert "Linear" in text and "LayerNorm" in text and "Residual" in text
    assert "parameters" in text and "activations" in text and "total" in text


@pytest.mark.parametrize(
    "x, error, match",
    [
        (np.ones((4, 7), np.float32), ValueError, r"x: expected 12 features .*Linear\(12, 32\).*got 7"),
        (np.ones((4, 20), np.float32)[:, :7], ValueError, r"x: expected 12 features .*got 7"),
        (np.ones((4, 12), np.float64), TypeError, "x: expected a float32"),
        (np.full((4, 12), np.nan, np.float32), ValueError, "x contains NaN"),
        ("hello", TypeError, "x"),
    ],
)
def test_bad_inputs_raise_clear_errors(x, error, match):
    with pytest.raises(error, match=match):
        mlp()(x)


def test_labels_out_of_range_raise_index_error():
    step = gt.TrainStep(mlp(), nn.CrossEntropyLoss())
    with pytest.raises(IndexError, match="target"):
        step(np.ones((4, 12), np.float32), np.array([0, 1, 5, 2]))
    with pytest.raises(TypeError, match="y: expected an integer"):
        step(np.ones((4, 12), np.float32), np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="targets"):
        step(np.ones((4, 12), np.float32), np.zeros(3, np.int64))


def test_layer_constructors_validate_arguments():
    with pytest.raises(ValueError, match="in_features"):
        nn.Linear(0, 3)
    with pytest.raises(TypeError, match="out_features"):
        nn.Linear(3, 2.5)
    with pytest.raises(ValueError, match="dropout probability"):
        nn.Dropout(1.5)
    with pytest.raises(ValueError, match="approximate"):
        nn.GELU("fast")
    with pytest.raises(ValueError, match="label_smoothing"):
        nn.CrossEntropyLoss(label_smoothing=1.5)
    with pytest.raises(TypeError, match="layer 1"):
        nn.Sequential(nn.ReLU(), "relu")


def test_named_modules_and_get_submodule_follow_pytorch():
    from gputrain.models import GPT

    model = GPT(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8)
    names = [name for name, _ in model.named_modules()]
    assert names[0] == "" and "h.1.attn" in names and "h.0.mlp.c_fc" in names
    assert model.get_submodule("h.1.mlp.c_fc") is model.h[1].mlp.c_fc
    assert model.get_submodule("") is model
    assert [n for n, _ in model.h[0].named_modules("block")][:2] == ["block", "block.ln_1"]
    with pytest.raises(AttributeError, match="no submodule 'nope'"):
        model.get_submodule("h.0.nope")
    with pytest.raises(AttributeError, match="names a list of modules"):
        model.get_submodule("h")
    with pytest.raises(TypeError, match="target must be a str"):
        model.get_submodule(1)

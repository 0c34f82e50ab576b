"""A Parameter is one object wherever its module goes (PyTorch's semantics): an optimizer built
before its layer is put in a container trains the layer there; TrainStep refuses an optimizer
over another model's parameters; a module used twice shares its parameters (gradients summed,
listed once by parameters(), under every name in state_dict())."""

from __future__ import annotations

import numpy as np
import pytest

import gputrain as gt

nn = gt.nn
OPTIMIZERS = {"sgd": lambda params: gt.optim.SGD(params, lr=0.5),
              "adamw": lambda params: gt.optim.AdamW(params, lr=0.05)}


def batch(rows=8, features=4, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((rows, features)).astype(np.float32), rng.integers(0, classes, rows)


def losses_of(step, count=20):
    x, y = batch()
    return [step(x, y).loss for _ in range(count)]


# -- an optimizer built before the container --------------------------------------------------
@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_optimizer_built_before_the_sequential_trains_the_layer(kind):
    gt.random.manual_seed(0)
    lin = nn.Linear(4, 3)
    optimizer = OPTIMIZERS[kind](lin.parameters())
    model = nn.Sequential(lin)
    before = model.state_dict()
    losses = losses_of(gt.TrainStep(model, nn.CrossEntropyLoss(), optimizer))
    assert losses[-1] < 0.8 * losses[0]
    assert optimizer.step_count == 20
    assert not np.array_equal(model.state_dict()["0.weight"], before["0.weight"])
    np.testing.assert_array_equal(lin.weight.data, model.state_dict()["0.weight"])


@pytest.mark.parametrize("location", ["device", "host"])
def test_ema_built_before_the_sequential_averages_the_layer_there(location):
    gt.random.manual_seed(0)
    lin = nn.Linear(4, 3)
    ema = gt.optim.EMA(lin, decay=0.5, location=location)
    initial = lin.weight.data.copy()
    model = nn.Sequential(lin)
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), gt.optim.SGD(model.parameters(), lr=0.5))
    x, y = batch()
    step(x, y)
    ema.update()
    trained = model.state_dict()["0.weight"]
    expected = (initial + np.float32(0.5) * (trained - initial)).astype(np.float32)
    average = ema.shadow[0]
    np.testing.assert_allclose(average, expected, rtol=1e-6, atol=1e-7)
    with ema.average_parameters():
        np.testing.assert_array_equal(model.state_dict()["0.weight"], average)
    np.testing.assert_array_equal(model.state_dict()["0.weight"], trained)


def test_optimizer_built_before_residual_nesting_trains_only_its_layers():
    gt.random.manual_seed(1)
    inner = nn.Linear(4, 4)
    optimizer = gt.optim.SGD(inner.parameters(), lr=0.5)
    block = nn.Residual(nn.Sequential(inner, nn.GELU()))  # compiled twice: block, then model
    head = nn.Linear(4, 3)
    model = nn.Sequential(nn.LayerNorm(4), block, head)
    before = model.state_dict()
    losses = losses_of(gt.TrainStep(model, nn.CrossEntropyLoss(), optimizer))
    assert losses[-1] < losses[0]
    after = model.state_dict()
    assert not np.array_equal(after["1.block.0.weight"], before["1.block.0.weight"])
    for name in ("0.weight", "0.bias", "2.weight", "2.bias"):
        np.testing.assert_array_equal(after[name], before[name])


def test_optimizer_state_and_step_count_follow_the_layer_into_a_container():
    gt.random.manual_seed(2)
    lin = nn.Linear(4, 3)
    optimizer = gt.optim.AdamW(lin.parameters(), lr=0.05)
    losses_of(gt.TrainStep(lin, nn.CrossEntropyLoss(), optimizer), 3)
    moments = optimizer.state[lin.weight]["exp_avg"].copy()
    model = nn.Sequential(lin, nn.ReLU())
    assert optimizer.state[lin.weight]["exp_avg"] == pytest.approx(moments)
    losses_of(gt.TrainStep(model, nn.CrossEntropyLoss(), optimizer), 2)
    assert optimizer.step_count == 5
    assert float(optimizer.state[lin.weight]["step"]) == 5.0


def test_optimizer_step_after_the_move_updates_the_container():
    gt.random.manual_seed(3)
    lin = nn.Linear(4, 3)
    optimizer = gt.optim.SGD(lin.parameters(), lr=1.0)
    model = nn.Sequential(lin)
    gt.TrainStep(model, nn.CrossEntropyLoss())(*batch())  # gradients only, no optimizer
    expected = lin.weight.data - lin.weight.grad
    optimizer.step()
    np.testing.assert_allclose(model.state_dict()["0.weight"], expected, rtol=1e-6)


def test_requires_grad_set_before_or_after_the_move_is_kept():
    gt.random.manual_seed(4)
    first, second = nn.Linear(4, 4), nn.Linear(4, 3)
    first.weight.requires_grad = False
    optimizer = gt.optim.SGD([*first.parameters(), *second.parameters()], lr=0.5)
    model = nn.Sequential(first, nn.ReLU(), second)
    assert first.weight.requires_grad is False
    second.bias.requires_grad = False
    before = model.state_dict()
    losses_of(gt.TrainStep(model, nn.CrossEntropyLoss(), optimizer), 3)
    after = model.state_dict()
    np.testing.assert_array_equal(after["0.weight"], before["0.weight"])
    np.testing.assert_array_equal(after["2.bias"], before["2.bias"])
    assert not np.array_equal(after["0.bias"], before["0.bias"])


# -- parameters() of a submodule ---------------------------------------------------------------
def test_a_layer_keeps_its_parameter_objects_in_the_container():
    lin = nn.Linear(4, 3)
    weight, bias = lin.weight, lin.bias
    model = nn.Sequential(nn.Linear(4, 4), lin)
    assert lin.weight is weight and lin.bias is bias
    assert [p for p in lin.parameters()] == [weight, bias]
    assert list(model.parameters())[2:] == [weight, bias]
    assert weight.name == "1.weight"
    weight.data[...] = 0.0
    bias.data[...] = 1.0
    np.testing.assert_array_equal(model(batch()[0]), np.ones((8, 3), np.float32))
    np.testing.assert_array_equal(model.state_dict()["1.weight"], np.zeros((3, 4), np.float32))


def test_optimizer_built_from_a_submodule_trains_only_it_after_more_nesting():
    gt.random.manual_seed(5)
    inner = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8))
    optimizer = gt.optim.SGD(inner[2].parameters(), lr=0.5)
    model = nn.Sequential(inner, nn.ReLU(), nn.Linear(8, 3))
    before = model.state_dict()
    losses_of(gt.TrainStep(model, nn.CrossEntropyLoss(), optimizer), 5)
    after = model.state_dict()
    for name in ("0.0.weight", "2.weight", "2.bias"):
        np.testing.assert_array_equal(after[name], before[name])
    assert not np.array_equal(after["0.2.weight"], before["0.2.weight"])


def test_a_model_whose_layer_was_taken_by_another_model_refuses_to_run_or_save():
    gt.random.manual_seed(9)
    lin = nn.Linear(4, 4)
    first = nn.Sequential(lin, nn.ReLU())
    optimizer = gt.optim.SGD(first.parameters(), lr=0.5)
    second = nn.Sequential(lin, nn.Linear(4, 3))
    for use in (lambda: first(batch()[0]), first.state_dict, lambda: list(first.parameters()),
                lambda: gt.TrainStep(first, nn.CrossEntropyLoss(), optimizer)):
        with pytest.raises(RuntimeError, match="its Linear layer was put in another model .Sequential."):
            use()
    before = second.state_dict()
    losses_of(gt.TrainStep(second, nn.CrossEntropyLoss(), optimizer), 3)  # it follows lin
    assert not np.array_equal(second.state_dict()["0.weight"], before["0.weight"])
    np.testing.assert_array_equal(second.state_dict()["1.weight"], before["1.weight"])


# -- TrainStep and an optimizer over other parameters -------------------------------------------
def test_train_step_refuses_another_models_optimizer_and_changes_nothing():
    model_a, model_b = nn.Sequential(nn.Linear(4, 3)), nn.Sequential(nn.Linear(4, 3))
    a_before, b_before = model_a.state_dict(), model_b.state_dict()
    with pytest.raises(ValueError, match="another model.*Sequential.*model.parameters"):
        gt.TrainStep(model_a, nn.CrossEntropyLoss(), gt.optim.SGD(model_b.parameters(), lr=0.1))
    mixed = gt.optim.SGD([*model_a.parameters(), *model_b.parameters()], lr=0.1)
    with pytest.raises(ValueError, match="parameter 2 "):
        gt.TrainStep(model_a, nn.CrossEntropyLoss(), mixed)
    for model, before in ((model_a, a_before), (model_b, b_before)):
        for name, value in model.state_dict().items():
            np.testing.assert_array_equal(value, before[name])


def test_train_step_refuses_a_standalone_parameter():
    model = nn.Sequential(nn.Linear(4, 3))
    loose = nn.Parameter(np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="standalone Parameter"):
        gt.TrainStep(model, nn.CrossEntropyLoss(), gt.optim.SGD([*model.parameters(), loose], lr=0.1))


def test_train_step_refuses_a_foreign_group_added_after_it_was_built():
    model, other = nn.Sequential(nn.Linear(4, 3)), nn.Sequential(nn.Linear(4, 3))
    optimizer = gt.optim.SGD(model.parameters(), lr=0.1)
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), optimizer)
    step(*batch())
    optimizer.add_param_group({"params": list(other.parameters())})
    before = model.state_dict()
    with pytest.raises(ValueError, match="another model"):
        step(*batch())
    np.testing.assert_array_equal(model.state_dict()["0.weight"], before["0.weight"])


# -- a module used twice: shared parameters ----------------------------------------------------
def shared_mlp():
    gt.random.manual_seed(6)
    lin = nn.Linear(4, 4)
    return lin, nn.Sequential(lin, nn.ReLU(), lin)


def test_a_shared_layer_is_listed_once_and_saved_under_every_name():
    lin, model = shared_mlp()
    assert [name for name, _ in model.named_parameters()] == ["0.weight", "0.bias"]
    assert list(model.parameters()) == [lin.weight, lin.bias]
    assert [name for name, _ in model.named_parameters(remove_duplicate=False)] == \
        ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert model.num_parameters() == model.compiled.num_parameters == 20
    assert len(list(model.modules())) == 3
    state = model.state_dict()
    assert list(state) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    np.testing.assert_array_equal(state["0.weight"], state["2.weight"])
    assert "(root)" in model.summary((8, 4))


def reference_forward(weight, bias, x):
    return np.maximum(x @ weight.T + bias, 0.0) @ weight.T + bias


def test_a_shared_layer_stays_one_layer_while_training():
    lin, model = shared_mlp()
    optimizer = gt.optim.AdamW(model.parameters(), lr=0.05)
    step = gt.TrainStep(model, nn.MSELoss(), optimizer)
    x = batch()[0]
    for _ in range(5):
        step(x, np.ones((8, 4), np.float32))
    state = model.state_dict()
    np.testing.assert_array_equal(state["0.weight"], state["2.weight"])
    np.testing.assert_array_equal(state["0.weight"], lin.weight.data)
    np.testing.assert_allclose(model(x), reference_forward(state["0.weight"], state["0.bias"], x), rtol=1e-5,
                               atol=1e-6)


def test_load_state_dict_writes_a_shared_layer():
    lin, model = shared_mlp()
    state = model.state_dict()
    rng = np.random.default_rng(7)
    new_weight = rng.standard_normal((4, 4)).astype(np.float32)
    state["0.weight"] = state["2.weight"] = new_weight
    model.load_state_dict(state)
    np.testing.assert_array_equal(lin.weight.data, new_weight)
    x = batch()[0]
    np.testing.assert_allclose(model(x), reference_forward(new_weight, state["0.bias"], x), rtol=1e-5, atol=1e-6)
    _, copy = shared_mlp()
    copy.load_state_dict(model.state_dict())  # strict round trip
    np.testing.assert_array_equal(copy(x), model(x))


@pytest.mark.parametrize("micro_batches, checkpointing, set_to_none",
                         [(1, False, True), (2, False, False), (2, True, True)])
def test_shared_gradients_are_the_sum_over_uses(micro_batches, checkpointing, set_to_none):
    gt.random.manual_seed(8)
    lin, norm = nn.Linear(4, 4), nn.LayerNorm(4)
    block = nn.Residual(norm, lin, nn.GELU())
    head = nn.Linear(4, 3)
    tied = nn.Sequential(block, lin, block, head)
    values = {name: p.data.copy() for name, p in tied.named_parameters()}
    gt.random.manual_seed(8)
    untied = nn.Sequential(nn.Residual(nn.LayerNorm(4), nn.Linear(4, 4), nn.GELU()), nn.Linear(4, 4),
                           nn.Residual(nn.LayerNorm(4), nn.Linear(4, 4), nn.GELU()), nn.Linear(4, 3))
    source = {"0.block.0": "0.block.0", "0.block.1": "0.block.1", "1": "0.block.1", "2.block.0": "0.block.0",
              "2.block.1": "0.block.1", "3": "3"}
    untied.load_state_dict({f"{layer}.{kind}": values[f"{source[layer]}.{kind}"]
                            for layer in source for kind in ("weight", "bias")})
    x, y = batch(rows=8)
    options = {"micro_batches": micro_batches, "gradient_checkpointing": checkpointing,
               "set_to_none": set_to_none}
    loss_tied = gt.TrainStep(tied, nn.CrossEntropyLoss(), **options)(x, y).loss
    loss_untied = gt.TrainStep(untied, nn.CrossEntropyLoss(), **options)(x, y).loss
    assert loss_tied == pytest.approx(loss_untied, rel=1e-6)
    untied_grads = {name: p.grad for name, p in untied.named_parameters()}
    for name, p in tied.named_parameters():
        users = [layer for layer, first in source.items() if name.startswith(first + ".")]
        kind = name.rsplit(".", 1)[1]
        expected = sum(untied_grads[f"{layer}.{kind}"] for layer in users)
        np.testing.assert_allclose(p.grad, expected, rtol=1e-5, atol=1e-6, err_msg=name)


def test_a_shared_layer_trains_in_half_precision():
    lin, model = shared_mlp()
    step = gt.TrainStep(model, nn.MSELoss(), gt.optim.SGD(model.parameters(), lr=0.1), precision="bf16")
    x = batch()[0]
    losses = [step(x, np.ones((8, 4), np.float32)).loss for _ in range(10)]
    assert losses[-1] < losses[0]
    state = model.state_dict()
    np.testing.assert_array_equal(state["0.weight"], state["2.weight"])


@pytest.mark.parametrize("spec", [[("tied", 0)], [("linear", 2, 2, True), ("tied", 1)],
                                  [("linear", 2, 2, True), ("tied", -1)]])
def test_a_tied_spec_must_name_an_earlier_layer_with_parameters(spec):
    with pytest.raises(ValueError, match="a tied layer must name an earlier layer with parameters"):
        gt._C.Model(spec, 0)


@pytest.mark.parametrize("precision", ["bf16", "f16"])
def test_assigning_data_is_what_the_next_forward_computes_with(precision):
    """p.data = x in a half-precision model: the GEMMs read the half copy, which follows at once
    (as torch's p.data = x takes effect at once); it was stale until the next step."""
    layer = nn.Linear(8, 4, bias=False)
    layer.compiled.precision = precision
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    before = layer(x)
    layer.weight.data = np.ones((4, 8), np.float32)
    after = layer(x)
    assert not np.array_equal(before, after)
    reference = nn.Linear(8, 4, bias=False)
    reference.load_state_dict({"weight": np.ones((4, 8), np.float32)})
    reference.compiled.precision = precision
    assert np.array_equal(after, reference(x))

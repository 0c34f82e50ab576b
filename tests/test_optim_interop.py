"""PyTorch interop of AdamW/SGD (issue 24): torch's implementation flags honoured or refused with
a reason, torch's state_dict loaded (tensor steps, through duck-typed tensors here, so that this
runs without torch), and state_dict(format="torch"). Against the real torch at the end, skipped
where torch is not importable."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from gputrain.nn import Parameter
from gputrain.optim import SGD, AdamW

SHAPES = [(3, 2), (3,)]


class FakeTensor:
    """A CPU tensor's duck type: NumPy reads it through __array__ (as it reads torch's)."""

    def __init__(self, value) -> None:
        self._value = np.asarray(value, dtype=np.float32)

    def __array__(self, dtype=None, copy=None):
        return self._value if dtype is None else self._value.astype(dtype)


class FakeDeviceTensor:
    """A tensor in device memory: NumPy cannot read it; .cpu() gives a host copy (as torch's)."""

    def __init__(self, value) -> None:
        self._value = value

    def __array__(self, dtype=None, copy=None):
        raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() first.")

    def cpu(self):
        return FakeTensor(self._value)


def params(seed=0):
    rng = np.random.default_rng(seed)
    return [Parameter(rng.standard_normal(s).astype(np.float32)) for s in SHAPES]


def run(opt, ps, steps=3, seed=1):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        for p in ps:
            p.grad = rng.standard_normal(p.shape).astype(np.float32)
        opt.step()
    return [p.data.copy() for p in ps]


def torch_adamw_dict(tensor=FakeTensor, **group):
    """A dict shaped exactly as torch.optim.AdamW(...).state_dict() after 3 steps."""
    rng = np.random.default_rng(7)
    state = {i: {"step": tensor(3.0), "exp_avg": tensor(rng.standard_normal(s)),
                 "exp_avg_sq": tensor(rng.random(s))} for i, s in enumerate(SHAPES)}
    groups = [{"lr": 0.01, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01, "amsgrad": False,
               "maximize": False, "foreach": None, "capturable": False, "differentiable": False, "fused": None,
               "decoupled_weight_decay": True, "params": [0, 1], **group}]
    return {"state": state, "param_groups": groups}


def torch_sgd_dict(**group):
    """A dict shaped exactly as torch.optim.SGD(..., momentum=0.9).state_dict() after a step."""
    rng = np.random.default_rng(8)
    state = {i: {"momentum_buffer": FakeTensor(rng.standard_normal(s))} for i, s in enumerate(SHAPES)}
    groups = [{"lr": 0.1, "momentum": 0.9, "dampening": 0, "weight_decay": 0, "nesterov": False, "maximize": False,
               "foreach": None, "differentiable": False, "fused": None, "params": [0, 1], **group}]
    return {"state": state, "param_groups": groups}


# ---- the flags -----------------------------------------------------------------------------------

@pytest.mark.parametrize("flags", [dict(fused=True), dict(fused=False), dict(fused=None), dict(foreach=True),
                                   dict(foreach=False), dict(capturable=True), dict(capturable=False),
                                   dict(differentiable=False), dict(fused=np.bool_(True))])
def test_adamw_accepts_torch_s_implementation_flags_and_computes_the_same(flags):
    expected = run(AdamW(ps := params(), lr=0.01), ps)
    got = run(AdamW(qs := params(), lr=0.01, **flags), qs)
    for a, b in zip(expected, got):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("flags", [dict(fused=True), dict(foreach=False), dict(differentiable=False)])
def test_sgd_accepts_torch_s_implementation_flags_and_computes_the_same(flags):
    expected = run(SGD(ps := params(), lr=0.1, momentum=0.9), ps)
    got = run(SGD(qs := params(), lr=0.1, momentum=0.9, **flags), qs)
    for a, b in zip(expected, got):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(("make", "error", "match"), [
    (lambda ps: AdamW(ps, differentiable=True), ValueError, "differentiable=True is not supported: .*autograd"),
    (lambda ps: SGD(ps, differentiable=True), ValueError, "differentiable=True is not supported"),
    (lambda ps: AdamW(ps, fused="yes"), TypeError, "fused must be None or a bool, not str"),
    (lambda ps: AdamW(ps, foreach=1), TypeError, "foreach must be None or a bool, not int"),
    (lambda ps: AdamW(ps, capturable=None), TypeError, "capturable must be a bool, not NoneType"),
    (lambda ps: SGD(ps, capturable=True), TypeError, "capturable"),  # torch's SGD has no such flag either
])
def test_flags_gputrain_cannot_honour_are_refused_by_name(make, error, match):
    with pytest.raises(error, match=match):
        make(params())


def test_maximize_is_honoured():
    ps, qs = params(), params()
    opt, flipped = SGD(ps, lr=0.1, maximize=True), SGD(qs, lr=0.1)
    for p, q in zip(ps, qs):
        p.grad = np.ones(p.shape, np.float32)
        q.grad = -np.ones(q.shape, np.float32)
    opt.step()
    flipped.step()
    for p, q in zip(ps, qs):
        np.testing.assert_array_equal(p.data, q.data)


# ---- loading torch's state_dict ------------------------------------------------------------------------

@pytest.mark.parametrize("tensor", [FakeTensor, FakeDeviceTensor], ids=["cpu tensors", "device tensors"])
def test_adamw_loads_a_torch_state_dict(tensor):
    saved = torch_adamw_dict(tensor)
    opt = AdamW(params(), lr=0.5)
    opt.load_state_dict(saved)
    sd = opt.state_dict()
    assert opt.param_groups[0]["lr"] == 0.01
    assert set(opt.param_groups[0]) == {"lr", "betas", "eps", "weight_decay", "amsgrad", "maximize", "params"}
    for i in range(2):
        assert sd["state"][i]["step"] == 3.0
        for name in ("exp_avg", "exp_avg_sq"):
            source = saved["state"][i][name]
            source = source.cpu() if isinstance(source, FakeDeviceTensor) else source
            np.testing.assert_array_equal(sd["state"][i][name], np.asarray(source))


def test_sgd_loads_a_torch_state_dict():
    saved = torch_sgd_dict()
    opt = SGD(params(), lr=0.5, momentum=0.5)
    opt.load_state_dict(saved)
    sd = opt.state_dict()
    assert opt.param_groups[0]["momentum"] == 0.9
    for i in range(2):
        np.testing.assert_array_equal(sd["state"][i]["momentum_buffer"], np.asarray(saved["state"][i]["momentum_buffer"]))


def test_array_likes_and_python_numbers_load_too():
    saved = torch_adamw_dict()
    saved["state"][0] = {"step": 3, "exp_avg": [[0.5, 0.25]] * 3, "exp_avg_sq": np.ones((3, 2), np.float64)}
    saved["state"][1]["step"] = np.float32(3)
    opt = AdamW(params())
    opt.load_state_dict(saved)
    np.testing.assert_array_equal(opt.state_dict()["state"][0]["exp_avg"], np.array([[0.5, 0.25]] * 3, np.float32))


@pytest.mark.parametrize(("change", "error", "match"), [
    (dict(differentiable=True), ValueError, r"state_dict\['param_groups'\]\[0\]\['differentiable'\]=True is not"),
    (dict(decoupled_weight_decay=False), ValueError, r"\['decoupled_weight_decay'\]=False is Adam with an L2"),
    (dict(fused="no"), TypeError, r"\['fused'\] must be None or a bool, not str"),
    (dict(capturable=None), TypeError, r"\['capturable'\] must be a bool"),
])
def test_a_torch_state_dict_with_a_flag_gputrain_cannot_honour_is_refused_and_changes_nothing(change, error, match):
    opt = AdamW(ps := params(), lr=0.02)
    run(opt, ps, steps=2)
    before = opt.state_dict()
    with pytest.raises(error, match=match):
        opt.load_state_dict(torch_adamw_dict(**change))
    after = opt.state_dict()
    assert after["param_groups"] == before["param_groups"]
    for i in before["state"]:
        for name, value in before["state"][i].items():
            np.testing.assert_array_equal(after["state"][i][name], value)


def test_a_bad_tensor_step_is_named():
    saved = torch_adamw_dict()
    saved["state"][1]["step"] = FakeTensor(2.5)
    with pytest.raises(ValueError, match=r"state_dict\['state'\]\[1\]\['step'\] must be a whole number"):
        AdamW(params()).load_state_dict(saved)
    saved["state"][1]["step"] = FakeTensor([1.0, 2.0])
    with pytest.raises(TypeError, match=r"\['step'\] must be a real number, not ndarray"):
        AdamW(params()).load_state_dict(saved)


# ---- state_dict(format="torch") --------------------------------------------------------------------------

def test_torch_format_without_torch_is_torch_s_layout_with_numpy_arrays(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    opt = AdamW(ps := params(), lr=0.01, fused=True, capturable=True)
    run(opt, ps)
    sd = opt.state_dict(format="torch")
    assert sd["param_groups"] == [{"lr": 0.01, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01,
                                   "amsgrad": False, "maximize": False, "foreach": None, "capturable": True,
                                   "differentiable": False, "fused": True, "decoupled_weight_decay": True,
                                   "params": [0, 1]}]
    step = sd["state"][0]["step"]
    assert isinstance(step, np.ndarray) and step.shape == () and step.dtype == np.float32 and step == 3.0
    # it loads back into gputrain unchanged
    again = AdamW(params())
    again.load_state_dict(sd)
    for i in range(2):
        for name in ("exp_avg", "exp_avg_sq"):
            np.testing.assert_array_equal(again.state_dict()["state"][i][name], sd["state"][i][name])
    sgd = SGD(params(), lr=0.1, momentum=0.9, foreach=False)
    run(sgd, sgd.param_groups[0]["params"])
    group = sgd.state_dict(format="torch")["param_groups"][0]
    assert (group["foreach"], group["differentiable"], group["fused"]) == (False, False, None)
    assert "capturable" not in group and "decoupled_weight_decay" not in group
    with pytest.raises(ValueError, match="format must be 'gputrain' or 'torch', got 'pytorch'"):
        opt.state_dict(format="pytorch")


def test_a_state_dict_torch_saved_loads_and_continues_as_torch_did():
    """torch.optim.AdamW's state_dict after 3 steps (its tensors turned into arrays, its tensor
    step a 0-d array; tests/fixtures/make_hf_trainer_logs.py), loaded here; 2 more steps land
    where torch's did."""
    import json
    import os

    saved = np.load(os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "torch_adamw_state.npz"))
    group = json.loads(str(saved["group"]))
    group["betas"] = tuple(group["betas"])  # JSON kept torch's tuple as a list
    state = {"state": {i: {key: saved[f"state_{i}_{key}"] for key in ("step", "exp_avg", "exp_avg_sq")}
                       for i in range(2)},
             "param_groups": [group]}
    assert state["state"][0]["step"].shape == ()  # torch's tensor step
    ours = [Parameter(saved[f"param_{i}"].copy()) for i in range(2)]
    opt = AdamW(ours, lr=0.5)
    opt.load_state_dict(state)
    assert opt.param_groups[0]["betas"] == (0.8, 0.95) and opt.param_groups[0]["weight_decay"] == 0.05
    for step in (3, 4):
        for i, p in enumerate(ours):
            p.grad = saved[f"grad_{step}_{i}"]
        opt.step()
    for i, p in enumerate(ours):
        np.testing.assert_allclose(p.data, saved[f"after_{i}"], rtol=0, atol=1e-6)


# ---- the real torch (skipped without it) ---------------------------------------------------------------

def test_round_trip_with_the_real_torch():
    torch = pytest.importorskip("torch")
    arrays = [p.data.copy() for p in params()]
    theirs = [torch.nn.Parameter(torch.from_numpy(a.copy())) for a in arrays]
    topt = torch.optim.AdamW(theirs, lr=0.01, foreach=False)
    rng = np.random.default_rng(3)
    for _ in range(3):
        for t in theirs:
            t.grad = torch.from_numpy(rng.standard_normal(tuple(t.shape)).astype(np.float32))
        topt.step()
    ours = [Parameter(t.detach().numpy().copy()) for t in theirs]
    opt = AdamW(ours, lr=0.5)
    opt.load_state_dict(topt.state_dict())  # tensor steps, torch's flags
    assert opt.state_dict()["state"][0]["step"] == 3.0
    back = opt.state_dict(format="torch")
    assert isinstance(back["state"][0]["step"], torch.Tensor) and back["state"][0]["step"].dim() == 0
    fresh = [torch.nn.Parameter(torch.from_numpy(p.data.copy())) for p in ours]
    topt2 = torch.optim.AdamW(fresh, lr=0.5, foreach=False)
    topt2.load_state_dict(back)
    for i, t in enumerate(theirs):
        for name in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(topt2.state[fresh[i]][name], topt.state[t][name])
    assert topt2.param_groups[0]["lr"] == 0.01
    # both continue and agree (the same update, PyTorch's CPU arithmetic)
    for _ in range(2):
        for p, t, t2 in zip(ours, theirs, fresh):
            g = rng.standard_normal(p.shape).astype(np.float32)
            p.grad, t.grad, t2.grad = g, torch.from_numpy(g.copy()), torch.from_numpy(g.copy())
        opt.step()
        topt.step()
        topt2.step()
    for p, t, t2 in zip(ours, theirs, fresh):
        np.testing.assert_allclose(p.data, t.detach().numpy(), rtol=0, atol=1e-6)
        assert torch.equal(t, t2)

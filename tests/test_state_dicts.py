"""load_state_dict is all or nothing (issue 10, items 5 and 6): a damaged state dict (missing or
extra keys, wrong shapes, dtypes or types, NaN/Inf, values out of range, a bad value after good
ones) raises KeyError, TypeError or ValueError and leaves the object bit for bit as it was, so
the next training step gives what an untouched object gives. Covers nn.Module, AdamW, SGD,
LambdaLR, EMA, GradScaler and DataLoader; the damage is drawn by hypothesis from a valid state
dict of a *different* run, so any half-applied load would show."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gputrain as gt
from gputrain import nn
from gputrain.amp import GradScaler
from gputrain.optim import EMA, SGD, AdamW, LambdaLR

ERRORS = (KeyError, TypeError, ValueError)
_RNG = np.random.default_rng(0)
X = _RNG.standard_normal((64, 4)).astype(np.float32)
Y = _RNG.integers(0, 3, 64)


class World:
    """A model, its optimizer, schedule, EMA, loss scaler and loader after `steps` steps."""

    def __init__(self, optimizer: str, seed: int, steps: int) -> None:
        gt.random.manual_seed(seed)
        self.model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
        if optimizer == "adamw":
            self.optimizer = AdamW(self.model.parameters(), lr=1e-2, weight_decay=0.1)
        else:
            self.optimizer = SGD(self.model.parameters(), lr=1e-2, momentum=0.9)
        self.scheduler = LambdaLR(self.optimizer, lambda s: 1.0 / (1.0 + s))
        self.ema = EMA(self.model, decay=0.9)
        self.scaler = GradScaler(init_scale=2.0**8, growth_interval=3)
        self.loader = gt.DataLoader((X, Y), batch_size=8, shuffle=True, seed=seed)
        self.batches = iter(self.loader)
        self.train_step = gt.TrainStep(self.model, nn.CrossEntropyLoss(), self.optimizer,
                                       scaler=self.scaler, scheduler=self.scheduler)
        for _ in range(steps):
            self.advance()

    def advance(self) -> None:
        x, y = next(self.batches)
        self.train_step(x, y)
        self.ema.update()

    def objects(self) -> dict:
        return {"model": self.model, "optimizer": self.optimizer, "scheduler": self.scheduler,
                "ema": self.ema, "scaler": self.scaler, "loader": self.loader}

    def fingerprint(self) -> dict:
        return {name: canonical(obj.state_dict()) for name, obj in self.objects().items()}


def canonical(value):
    """A bit-exact, comparable form of a state dict (arrays as dtype, shape and bytes)."""
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, dict):
        return ("dict", tuple((repr(k), canonical(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(canonical(v) for v in value))
    if isinstance(value, float):
        return ("float", value.hex())
    return (type(value).__name__, repr(value))


_CONTROL: dict = {}


def control(optimizer: str) -> tuple[dict, dict, dict]:
    """(fingerprint after 2 steps, after 3 steps, state dicts of a different run) — computed once."""
    if optimizer not in _CONTROL:
        untouched = World(optimizer, seed=1, steps=2)
        before = untouched.fingerprint()
        untouched.advance()
        other = World(optimizer, seed=2, steps=3)
        _CONTROL[optimizer] = (before, untouched.fingerprint(),
                               {name: obj.state_dict() for name, obj in other.objects().items()})
    return _CONTROL[optimizer]


# --- damage -------------------------------------------------------------------------------------

NAN, INF = float("nan"), float("inf")
BAD_REALS = [NAN, INF, -INF, "0.5", None, [0.5], {}, True]
BAD_INTS = [1.5, "3", None, NAN, [1], True]
BAD_BOOLS = ["yes", None, 2, 0.5]


def bad_arrays(shape: tuple[int, ...], none_ok: bool = False) -> st.SearchStrategy:
    """Array values that are invalid for a float32 array of `shape`."""
    numel = int(np.prod(shape))
    wrong_shapes = [shape[:-1] + (shape[-1] + 1,), (numel + 1,), shape + (1,), ()]
    poisoned = st.tuples(st.integers(0, numel - 1), st.sampled_from([NAN, INF, -INF, 1e39])).map(
        lambda iv: np.put(a := np.ones(shape, np.float64), iv[0], iv[1]) or a)
    others = [np.full(shape, "x"), np.ones(shape, np.complex64), np.empty(shape, object), "abc", {}]
    if not none_ok:
        others.append(None)
    return st.one_of(poisoned, st.sampled_from(wrong_shapes).map(lambda s: np.zeros(s, np.float32)),
                     st.sampled_from(others))


def leaf_damage(state: dict, kind: str) -> st.SearchStrategy:
    """(path, bad value) pairs for the leaves of one kind of state dict."""
    options = []

    def add(path, values):
        options.append(st.tuples(st.just(path), values if isinstance(values, st.SearchStrategy)
                                 else st.sampled_from(values)))

    if kind == "model":
        for name, array in state.items():
            add((name,), bad_arrays(array.shape))
    elif kind in ("adamw", "sgd"):
        group = ("param_groups", 0)
        add(group + ("lr",), BAD_REALS + [-1.0])
        add(group + ("weight_decay",), BAD_REALS + [-0.5])
        add(group + ("maximize",), BAD_BOOLS)
        add(group + ("params",), [[0, 0, 1, 2], [0, 1, 2], [0, 1, 2, 3, 4], "0123", [0, 1, 2, -1], None])
        if kind == "adamw":
            add(group + ("eps",), BAD_REALS + [0.0, -1e-8])
            add(group + ("betas",), [(1.0, 0.999), (0.9, -0.1), (0.9,), "ab", None, (NAN, 0.9)])
            add(group + ("amsgrad",), BAD_BOOLS)
        else:
            add(group + ("momentum",), BAD_REALS + [-0.9])
            add(group + ("nesterov",), BAD_BOOLS)
        for index, saved in state["state"].items():
            for name, value in saved.items():
                if name == "step":
                    add(("state", index, name), [NAN, INF, -1.0, 1.5, "1", [1.0, 2.0]])
                else:
                    add(("state", index, name), bad_arrays(value.shape, none_ok=kind == "sgd"))
            if kind == "adamw":
                add(("state", index, "exp_avg_sq"), st.just(-np.ones(saved["exp_avg_sq"].shape)))
    elif kind == "scheduler":
        add(("last_epoch",), BAD_INTS + [-2])
        add(("_step_count",), BAD_INTS + [-1])
        for key in ("base_lrs", "_last_lr"):
            add((key,), [[NAN], "x", None, [0.1, 0.2], [-1.0], ["0.1"]])
        add(("lr_lambdas",), [None, [], [None, None]])
    elif kind == "ema":
        add(("decay",), BAD_REALS + [1.5, -0.1])
        add(("num_updates",), BAD_INTS + [-1])
        add(("use_warmup",), BAD_BOOLS)
        add(("shadow",), [None, "x", state["shadow"][:-1], state["shadow"] + state["shadow"][:1]])
        for index, array in enumerate(state["shadow"]):
            add(("shadow", index), bad_arrays(array.shape))
    elif kind == "scaler":
        add(("scale",), BAD_REALS + [0.0, -1.0, 1e-50, 1e39])
        add(("growth_factor",), BAD_REALS + [1.0, 0.5])
        add(("backoff_factor",), BAD_REALS + [0.0, 1.0, 1.5])
        add(("growth_interval",), BAD_INTS + [0, -1, 2**31])
        add(("_growth_tracker",), BAD_INTS + [-3, state["growth_interval"], state["growth_interval"] + 5])
    elif kind == "loader":
        add(("seed",), BAD_INTS + [-1, 2**64])
        add(("epoch",), BAD_INTS + [-1])
        add(("next_batch",), BAD_INTS + [-1])
        add(("done",), [[100], "x", [None], [-1], None, [1.5]])
        add(("num_batches",), BAD_INTS + [3])
        add(("version",), [2, None, "1"])
        add(("batches_yielded",), BAD_INTS + [99])
    return st.one_of(options)


def required_keys(state: dict, kind: str) -> list[tuple]:
    """Paths whose removal must be refused."""
    top = [(k,) for k in state if not (kind == "loader" and k == "batches_yielded")]
    if kind in ("adamw", "sgd"):
        top += [("param_groups", 0, k) for k in state["param_groups"][0] if k != "initial_lr"]  # the scheduler's
        if kind == "adamw":
            top += [("state", i, k) for i, saved in state["state"].items() for k in saved]
    return top


def set_path(state, path, value):
    target = state
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value


def damaged(state: dict, kind: str) -> st.SearchStrategy:
    """A deep copy of `state` with one definite defect."""
    def apply(change):
        what, path, value = change
        out = copy.deepcopy(state)
        if what == "set":
            set_path(out, path, value)
        elif what == "drop":
            target = out
            for key in path[:-1]:
                target = target[key]
            del target[path[-1]]
        else:  # an unexpected key
            target = out
            for key in path:
                target = target[key]
            target["unexpected_key"] = value
        return out

    extra_places = [()] + ([("state", 0)] if kind in ("adamw", "sgd") and 0 in state["state"] else [])
    return st.one_of(
        leaf_damage(state, kind).map(lambda pv: ("set", pv[0], pv[1])),
        st.sampled_from(required_keys(state, kind)).map(lambda p: ("drop", p, None)),
        st.sampled_from(extra_places).map(lambda p: ("extra", p, 1.0)),
    ).map(apply)


def check_unchanged_after(world: World, name: str, bad: dict, optimizer: str) -> None:
    before, after_one_more, _ = control(optimizer)
    assert world.fingerprint() == before
    with pytest.raises(ERRORS):
        world.objects()[name].load_state_dict(bad)
    assert world.fingerprint() == before, f"{name}.load_state_dict changed something before raising"
    world.advance()
    assert world.fingerprint() == after_one_more, "the next step differs from an untouched run's"


KINDS = [("model", "adamw", "model"), ("optimizer", "adamw", "adamw"), ("optimizer", "sgd", "sgd"),
         ("scheduler", "adamw", "scheduler"), ("ema", "adamw", "ema"), ("scaler", "adamw", "scaler"),
         ("loader", "adamw", "loader")]


@pytest.mark.parametrize("name, optimizer, kind", KINDS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_damaged_state_dict_raises_and_changes_nothing(name, optimizer, kind, data):
    other = control(optimizer)[2][name]
    bad = data.draw(damaged(other, kind), label="damaged state dict")
    check_unchanged_after(World(optimizer, seed=1, steps=2), name, bad, optimizer)


@pytest.mark.parametrize("name, optimizer, kind", KINDS)
def test_valid_state_dict_of_another_run_loads(name, optimizer, kind):
    world = World(optimizer, seed=1, steps=2)
    other = control(optimizer)[2][name]
    world.objects()[name].load_state_dict(copy.deepcopy(other))
    assert canonical(world.objects()[name].state_dict()) == canonical(other)


@pytest.mark.parametrize("name", ["model", "optimizer", "scheduler", "ema", "scaler", "loader"])
@pytest.mark.parametrize("value", [None, [1, 2], "state", 3.0])
def test_non_dict_state_is_a_type_error(name, value):
    world = World("adamw", seed=1, steps=2)
    with pytest.raises(TypeError, match="state_dict must be a dict"):
        world.objects()[name].load_state_dict(value)
    assert world.fingerprint() == control("adamw")[0]


# --- the cases of the issue ---------------------------------------------------------------------


def test_scaler_scale_zero_is_refused_instead_of_turning_weights_nan():
    world = World("adamw", seed=1, steps=2)
    state = world.scaler.state_dict()
    for scale in (0.0, 1e-46):  # 1e-46 is 0 in float32
        with pytest.raises(ValueError, match=r"state_dict\['scale'\]"):
            world.scaler.load_state_dict(dict(state, scale=scale))
    world.advance()
    assert all(np.isfinite(p.data).all() for p in world.model.parameters())
    assert world.fingerprint() == control("adamw")[1]


@pytest.mark.parametrize("tracker", [-3, 3, 4, 2**31 - 1])
def test_scaler_growth_tracker_outside_the_interval_is_refused(tracker):
    scaler = GradScaler(growth_interval=3)
    with pytest.raises(ValueError, match=r"state_dict\['_growth_tracker'\] must be in \[0, 2\]"):
        scaler.load_state_dict(dict(scaler.state_dict(), _growth_tracker=tracker))
    assert scaler._get_growth_tracker() == 0


def test_scaler_state_dict_names_missing_and_unexpected_keys():
    scaler = GradScaler()
    state = scaler.state_dict()
    with pytest.raises(KeyError, match=r"missing keys \['_growth_tracker'\], unexpected keys \['growth_tracker'\]"):
        scaler.load_state_dict({**{k: v for k, v in state.items() if k != "_growth_tracker"}, "growth_tracker": 0})


def test_model_state_with_a_bad_value_after_good_ones_changes_nothing():
    world = World("adamw", seed=1, steps=2)
    bad = control("adamw")[2]["model"].copy()
    last = list(bad)[-1]
    bad[last] = np.full(bad[last].shape, np.nan, np.float32)
    with pytest.raises(ValueError, match=f"state_dict\\['{last}'\\] holds NaN"):
        world.model.load_state_dict(bad)
    assert world.fingerprint() == control("adamw")[0]


def test_adamw_state_with_amsgrad_is_refused_and_later_steps_still_work():
    world = World("adamw", seed=1, steps=2)
    other = World("adamw", seed=2, steps=0)
    amsgrad = AdamW(other.model.parameters(), amsgrad=True)
    for p in other.model.parameters():
        p.grad = np.ones(p.shape, np.float32)
    amsgrad.step()
    with pytest.raises(ValueError, match="amsgrad"):
        world.optimizer.load_state_dict(amsgrad.state_dict())
    assert world.optimizer.param_groups[0]["amsgrad"] is False
    assert world.fingerprint() == control("adamw")[0]
    world.advance()
    assert world.fingerprint() == control("adamw")[1]


def test_scheduler_ignores_torch_only_keys_but_refuses_unknown_ones():
    world = World("adamw", seed=1, steps=2)
    state = world.scheduler.state_dict()
    world.scheduler.load_state_dict({**state, "verbose": False, "_get_lr_called_within_step": False})
    with pytest.raises(KeyError, match="unexpected keys"):
        world.scheduler.load_state_dict({**state, "last_lr": [0.1]})


def test_math_nan_is_not_a_valid_step_count():
    world = World("adamw", seed=1, steps=2)
    state = copy.deepcopy(world.optimizer.state_dict())
    state["state"][0]["step"] = np.array(math.nan, np.float32)
    with pytest.raises(ValueError, match=r"state_dict\['state'\]\[0\]\['step'\]"):
        world.optimizer.load_state_dict(state)


def test_c_set_state_checks_every_slot_before_writing_any():
    world = World("adamw", seed=1, steps=2)
    core, shape = world.optimizer._core, world.model[0].weight.shape
    before = core.get_state(0)
    good, bad = np.full(int(np.prod(shape)), 7.0, np.float32), np.zeros(3, np.float32)
    with pytest.raises(ValueError, match="state 'exp_avg_sq' of parameter 0 has 3 elements"):
        core.set_state(0, 99, {"exp_avg": good, "exp_avg_sq": bad})
    with pytest.raises(ValueError, match="'max_exp_avg_sq' is not kept"):
        core.set_state(0, 99, {"exp_avg": good, "max_exp_avg_sq": good})
    after = core.get_state(0)
    assert after["step"] == before["step"]
    assert all(np.array_equal(after[k], before[k]) for k in before if k != "step")

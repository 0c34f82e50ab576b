"""The op descriptor's consumers (csrc/ops/ops.h, GT_OP_LIST) and the C module's stub.

`_C.pyi` is checked against the built module (and `_C_testing.pyi` against the test-only
extension): every public function and class member of `gputrain._C` has a stub, a stub's parameter names are those of the object's
`__text_signature__` (where the binding declares one), and the stub lists nothing the module
lacks, so the stub cannot drift from the bindings silently. The device counters count every
launching op of the table (GT_OP_LIST) on sim, the CNN ops included."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import gputrain as gt
import gputrain._C as C
import gputrain._C_testing as C_testing

STUB = Path(gt.__file__).with_name("_C.pyi")
MODULES = {"_C": C, "_C_testing": C_testing}  # the extensions, each with its stub <name>.pyi beside it
with_stubs = pytest.mark.parametrize("module", sorted(MODULES))


def stub_tree(module: str = "_C") -> dict[str, ast.AST]:
    """Top-level names of a module's stub: functions, classes and annotated or assigned names."""
    names: dict[str, ast.AST] = {}
    for node in ast.parse(STUB.with_name(f"{module}.pyi").read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        elif isinstance(node, ast.Assign):
            names.update({t.id: node for t in node.targets if isinstance(t, ast.Name)})
    return names


def class_members(node: ast.ClassDef) -> dict[str, ast.AST]:
    """Members a class stub declares: methods, properties and annotated attributes."""
    members: dict[str, ast.AST] = {}
    for item in node.body:
        if isinstance(item, ast.FunctionDef):
            members[item.name] = item
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            members[item.target.id] = item
    return members


def stub_params(node: ast.FunctionDef, method: bool) -> list[str]:
    """Parameter names of a stub, `self` (or a classmethod's `cls`) left out, `*args`/`**kw` written as such."""
    a = node.args
    names = [p.arg for p in a.posonlyargs + a.args]
    if method and names and names[0] in ("self", "cls"):
        names = names[1:]
    if a.vararg:
        names.append("*" + a.vararg.arg)
    names += [p.arg for p in a.kwonlyargs]
    if a.kwarg:
        names.append("**" + a.kwarg.arg)
    return names


def text_params(obj: object) -> list[str] | None:
    """Parameter names of a builtin's __text_signature__ (`$self`, `$module` and the `/` and `*`
    markers left out; its defaults, such as `inf`, need not be Python literals); None when the
    binding declares none."""
    text = getattr(obj, "__text_signature__", None)
    if text is None:
        return None
    node = ast.parse(f"def f{text.replace('$', '')}: pass").body[0]
    names = stub_params(node, method=False)
    return names[1:] if names[:1] in (["self"], ["module"], ["type"]) else names


def public(name: str) -> bool:
    return not name.startswith("__")


def module_names(module: str = "_C") -> dict[str, object]:
    return {n: getattr(MODULES[module], n) for n in dir(MODULES[module]) if public(n)}


def own_members(cls: type) -> dict[str, object]:
    """Public members a class defines itself (not inherited from object or an exception)."""
    return {n: v for n, v in vars(cls).items() if public(n)}


def is_class(obj: object) -> bool:
    return isinstance(obj, type)


def test_the_stub_check_sees_a_missing_member():
    """A member of a class that its stub does not declare is reported."""
    node = ast.parse("class Buffer:\n    def numpy(self) -> None: ...").body[0]
    assert {"nbytes", "device", "pinned", "address"} <= set(own_members(C.Buffer)) - set(class_members(node))


@with_stubs
def test_every_public_name_of_the_module_has_a_stub(module):
    stubs = stub_tree(module)
    missing = [n for n in module_names(module) if n not in stubs]
    assert missing == [], f"{module}.pyi lacks {missing}"


@with_stubs
def test_the_stub_lists_nothing_the_module_lacks(module):
    extra = [n for n in stub_tree(module) if not hasattr(MODULES[module], n)]
    assert extra == [], f"{module}.pyi lists {extra}, which gputrain.{module} does not have"


def test_import_gputrain_does_not_import_the_test_only_extension():
    code = ("import sys, gputrain, gputrain.functional, gputrain.models, gputrain.trainer\n"
            "assert 'gputrain._C_testing' not in sys.modules, 'imported'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@with_stubs
def test_function_stubs_have_the_bindings_parameter_names(module):
    stubs = stub_tree(module)
    wrong = {}
    for name, obj in module_names(module).items():
        node = stubs.get(name)
        if is_class(obj) or not isinstance(node, ast.FunctionDef):
            continue
        names = text_params(obj)
        if names is not None and names != stub_params(node, method=False):
            wrong[name] = (names, stub_params(node, method=False))
    assert wrong == {}, f"(binding, stub) parameter names differ: {wrong}"


@with_stubs
def test_class_stubs_have_the_bindings_members_and_parameter_names(module):
    stubs = stub_tree(module)
    problems = []
    for cname, cls in module_names(module).items():
        node = stubs.get(cname)
        if not is_class(cls) or not isinstance(node, ast.ClassDef):
            continue
        declared = class_members(node)
        members = own_members(cls)
        problems += [f"{cname}.{m}: no stub" for m in members if m not in declared]
        problems += [f"{cname}.{m}: not in the module" for m in declared
                     if m != "__init__" and not hasattr(cls, m)]
        for m, obj in members.items():
            item = declared.get(m)
            names = text_params(obj) if callable(obj) else None
            if isinstance(item, ast.FunctionDef) and names is not None and names != stub_params(item, method=True):
                problems.append(f"{cname}.{m}: binding {names}, stub {stub_params(item, method=True)}")
    assert problems == []


def test_the_stub_check_sees_a_renamed_parameter():
    """The comparison itself: a stub whose parameter is misnamed is reported."""
    node = ast.parse("def device_counters(dev: str, reset: bool = ...) -> dict[str, int]: ...").body[0]
    assert text_params(C.device_counters) != stub_params(node, method=False)


def cnn_step_launches(*middle: gt.nn.Module) -> int:
    """Launches of one sim training step of Conv2d -> middle -> Flatten -> Linear (after a first
    step, which plans the activations)."""
    nn = gt.nn
    gt.random.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), *middle, nn.Flatten(), nn.Linear(4 * 8 * 8, 3)).to("sim")
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), gt.optim.SGD.for_model(model, lr=0.1))
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((4, 2, 8, 8)).astype(np.float32), rng.integers(0, 3, 4).astype(np.int64)
    step(x, y)
    gt.device_counters("sim", reset=True)
    step(x, y)
    return gt.device_counters("sim", reset=True)["launches"]


@pytest.mark.sim
@pytest.mark.parametrize("layer", ["Conv2d", "BatchNorm2d", "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d"])
def test_the_device_counters_count_the_cnn_ops_of_a_sim_step(layer):
    """A layer whose step runs one forward and one backward op of the table adds (at least) two
    launches: every launching op of GT_OP_LIST is counted (pass-through tables once left the
    conv2d, batchnorm and pool2d ops out)."""
    nn = gt.nn
    extra = {"Conv2d": lambda: nn.Conv2d(4, 4, 3, padding=1), "BatchNorm2d": lambda: nn.BatchNorm2d(4),
             "MaxPool2d": lambda: nn.MaxPool2d(3, stride=1, padding=1),
             "AvgPool2d": lambda: nn.AvgPool2d(3, stride=1, padding=1),
             "AdaptiveAvgPool2d": lambda: nn.AdaptiveAvgPool2d(8)}[layer]
    assert cnn_step_launches(extra()) - cnn_step_launches() >= 2

"""Every public name of gputrain has a docstring (the API reference is generated from them).

Public: each module under gputrain whose dotted name has no part starting with "_"; in it, the
names of its ``__all__`` (or, without one, the classes and functions it defines), and every public
method, property, classmethod and staticmethod of those classes and of their gputrain base
classes. An override without a docstring of its own inherits its base's (``inspect.getdoc``; the
site renders it the same way through griffe-inherited-docstrings). Constants (tables such as
``training_args.FIELD_TABLE``) cannot carry a docstring of their own and are described by their
module's, and attributes (dataclass fields, ``__slots__`` entries) by their class's. Dunder
methods are described by their class. The site's reference pages must also
cover every public module (docs/reference/*.md, one ``::: module`` directive each).
"""

from __future__ import annotations

import importlib
import inspect
import pathlib
import pkgutil
import re

import gputrain

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"


def public_modules() -> list:
    """gputrain and every submodule with no private part in its dotted name."""
    modules = [gputrain]
    for info in pkgutil.walk_packages(gputrain.__path__, "gputrain."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            modules.append(importlib.import_module(info.name))
    return modules


def _is_ours(obj) -> bool:
    return (getattr(obj, "__module__", None) or "").split(".")[0] == "gputrain"


def _members(cls) -> dict:
    """{qualified name: object} of the public methods and properties of cls and its gputrain bases."""
    found = {}
    for klass in cls.__mro__:
        if not _is_ours(klass):
            continue
        for name, value in vars(klass).items():
            if name.startswith("_"):
                continue
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            if type(value).__name__ == "member_descriptor":
                continue  # a __slots__ attribute: data, described by its class as dataclass fields are
            if isinstance(value, property) or inspect.isroutine(value) or inspect.isdatadescriptor(value):
                found[f"{klass.__module__}.{klass.__qualname__}.{name}"] = (klass, name, value)
    return found


def public_names() -> dict:
    """{qualified name: (owner class or None, name, object)} of every public documented name."""
    names = {}
    for module in public_modules():
        names[module.__name__] = (None, module.__name__, module)
        exported = getattr(module, "__all__", None)
        if exported is None:
            exported = [name for name, value in vars(module).items() if not name.startswith("_")
                        and (inspect.isclass(value) or inspect.isfunction(value))
                        and value.__module__ == module.__name__]
        for name in exported:
            value = getattr(module, name)
            if inspect.ismodule(value) or not (inspect.isclass(value) or callable(value)):
                continue  # a submodule (checked as a module) or a constant
            if inspect.isclass(value) or inspect.isroutine(value):
                key = f"{value.__module__}.{value.__qualname__}" if _is_ours(value) else f"{module.__name__}.{name}"
            else:
                key = f"{module.__name__}.{name}"
            names[key] = (None, name, value)
            if inspect.isclass(value):
                names.update(_members(value))
    return names


def _docstring(owner, name, value) -> str:
    if owner is not None:  # a member: its own docstring, else the one it overrides
        doc = inspect.getdoc(value) if not isinstance(value, property) else value.__doc__
        if not doc:
            for base in owner.__mro__[1:]:
                inherited = base.__dict__.get(name)
                if inherited is not None:
                    inherited = getattr(inherited, "__func__", inherited)
                    doc = inherited.__doc__
                    if doc:
                        break
        return (doc or "").strip()
    if inspect.isclass(value):
        return (value.__dict__.get("__doc__") or "").strip()
    return (getattr(value, "__doc__", None) or "").strip()


def test_every_public_name_has_a_docstring():
    names = public_names()
    assert len(names) > 500  # the walk found the API (a broken walk must not pass by finding nothing)
    missing = sorted(key for key, (owner, name, value) in names.items() if not _docstring(owner, name, value))
    assert not missing, f"{len(missing)} of {len(names)} public names have no docstring:\n" + "\n".join(missing)


def _directives() -> dict:
    """{module: None (rendered whole) or the member names listed} of every ``::: module`` directive
    of docs/reference/*.md."""
    found = {}
    for page in (DOCS / "reference").glob("*.md"):
        for match in re.finditer(r"^::: ([\w.]+)\n((?:    .*\n)*)", page.read_text(), flags=re.M):
            members = re.search(r"^\s+members:\s*(.*)$", match.group(2), flags=re.M)
            listed = None if members is None else re.findall(r"\w+", members.group(1).replace("false", ""))
            found[match.group(1)] = listed
    return found


def test_the_reference_covers_every_public_module():
    directives = _directives()
    missing = sorted(m.__name__ for m in public_modules() if m.__name__ not in directives)
    assert not missing, f"public modules without a reference page entry (docs/reference/*.md): {missing}"


def test_a_package_page_lists_the_names_documented_nowhere_else():
    """A package rendered with a members list (its re-exports are documented in their modules)
    must list the names of its __all__ that are defined in it or in a private module."""
    for module in public_modules():
        listed = _directives().get(module.__name__)
        if listed is None:
            continue
        here = []
        for name in getattr(module, "__all__", ()):
            value = getattr(module, name)
            if inspect.ismodule(value) or not (inspect.isclass(value) or inspect.isroutine(value)):
                continue
            home = value.__module__
            if home == module.__name__ or any(part.startswith("_") for part in home.split(".")):
                here.append(name)
        assert set(here) <= set(listed), f"{module.__name__}: add {sorted(set(here) - set(listed))} to its members"

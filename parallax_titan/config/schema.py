"""Type checks of config values against the section dataclasses' annotations.

TorchTitan's loader accepts a string where an int belongs and fails much later; these checks
name the key, the expected type and the value. They serve both a TOML dict (before parsing) and
a parsed section object (values set in code bypass the TOML check). :func:`seed_problem` is the one
range check of a 64-bit seed (``debug.seed``, ``training.data_seed``, generation's ``seed``).
"""

import dataclasses
import types
import typing
from typing import Any, Literal


def describe(tp) -> str:
    """A readable name of annotation ``tp`` ("one of 'a', 'b'", "a list of str", "int")."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe(a) for a in typing.get_args(tp))
    if origin is list:
        (inner,) = typing.get_args(tp) or (Any,)
        return f"a list of {describe(inner)}"
    return getattr(tp, "__name__", str(tp))


def matches(value, tp) -> bool:
    """Whether ``value`` is of annotation ``tp`` (bools are not ints; ints are floats)."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return True
    if tp is type(None):
        return value is None
    if origin is Literal:
        return value in typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return any(matches(value, a) for a in typing.get_args(tp))
    if origin is list:
        args = typing.get_args(tp)
        return isinstance(value, list) and (not args or all(matches(v, args[0]) for v in value))
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(tp, type):
        return isinstance(value, tp)
    return True


def table_list_entry(tp):
    """The dataclass of a ``list[SomeDataclass]`` annotation (an array of TOML tables), else None."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) is list and len(args) == 1 and dataclasses.is_dataclass(args[0]):
        return args[0]
    return None


def toml_problems(data: dict, cls, prefix: str = "") -> list[str]:
    """Unknown keys and wrongly typed values of the TOML table ``data`` against dataclass ``cls``."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    problems = []
    for key, value in data.items():
        name = f"{prefix}{key}"
        if key not in names:
            problems.append(f"{name}: unknown key; valid keys here: {', '.join(sorted(names))}")
        elif dataclasses.is_dataclass(hints[key]):
            if isinstance(value, dict):
                problems.extend(toml_problems(value, hints[key], f"{name}."))
            else:
                problems.append(f"{name}: expected a [{name}] table, got {value!r}")
        elif (entry := table_list_entry(hints[key])) is not None:
            if isinstance(value, list) and all(isinstance(v, dict) for v in value):
                for i, v in enumerate(value):
                    problems.extend(toml_problems(v, entry, f"{name}[{i}]."))
            else:
                problems.append(f"{name}: expected [[{name}]] tables, got {value!r}")
        elif not matches(value, hints[key]):
            problems.append(f"{name}: expected {describe(hints[key])}, got {value!r} ({type(value).__name__})")
    return problems


def value_problems(section, prefix: str) -> list[str]:
    """Fields of the dataclass instance ``section`` whose values do not match their annotations."""
    hints = typing.get_type_hints(type(section))
    problems = []
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if not dataclasses.is_dataclass(hints[f.name]) and not matches(value, hints[f.name]):
            problems.append(f"{prefix}.{f.name}: expected {describe(hints[f.name])}, got {value!r}")
    return problems


def seed_problem(key: str, seed, unset: str = "") -> str | None:
    """``"<key>: expected an integer in [0, 2**64)..., got <seed>"`` unless ``seed`` is a 64-bit seed (an
    int, not a bool), or None where ``unset`` allows it; else None.

    torch's generators and the pre-tokenized permutation take 64 bits: a negative seed would be taken
    modulo 2**64 (another seed than the one given) and one of 2**64 or more fails only when it is
    first used. ``unset``: how None is given and what it means (e.g. "None (a fresh random seed)");
    empty: None is refused too.
    """
    if seed is None and unset:
        return None
    if isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed < 2**64:
        return None
    return f"{key}: expected an integer in [0, 2**64){' or ' + unset if unset else ''}, got {seed!r}"

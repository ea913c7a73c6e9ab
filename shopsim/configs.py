"""Config dataclasses: one validator, field documentation and command-line flags built from the fields.

Every config in shopsim (`agents.lm.sft.SFTConfig`, `baselines.core.config.LMConfig` and each algorithm's
`Config`) is a dataclass whose defaults are the recipe, with a docstring right after every field (the attribute
docstring convention) and ``typing.Literal[...]`` for options. This module reads those declarations, so a
default, a type, a range and a help text exist in one place:

* `validate(config)` checks every field against its annotation (Literal membership, bool/int/float/str, tuples,
  dicts, ``X | None``) and against the bounds declared in the field's metadata (`bounded`): ``min``/``max``
  (inclusive) and ``gt``/``lt`` (exclusive). It raises `shopsim.errors.ConfigError` naming the field, the bad
  value and what is allowed. A config calls it first thing in ``__post_init__``; cross-field rules stay there.
* `field_docs(cls)` returns the attribute docstrings, inherited along the MRO (a subclass that only changes a
  default keeps its base's doc); `field_meta` merges the bounds the same way.
* `check_options(owner, options, func=..., config=...)` checks keyword options (an env's constructor options from
  a JSON file or flag) against a function's annotated signature and a config's fields, with the same messages;
  `checked_options` is the decorator that runs it on every call of a constructor.
* `parse_text(name, text, annotation)` turns a command-line string into a field's type (``--set key=value``).
* `add_config_arguments(parser, cls)` adds one ``--field-name`` flag per field (type, choices, default, help from
  the docstring; bools as ``--x/--no-x``), and `config_from_args` builds the config back from the parsed args.
* `describe_config(cls)` renders the fields, their types, defaults and docs (``shopsim train --show-config``).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import json
import textwrap
import types
import typing
from collections.abc import Iterable
from typing import Any, Literal, Union

from shopsim.errors import ConfigError

__all__ = [
    "add_config_arguments",
    "bounded",
    "check_options",
    "checked_options",
    "config_fields",
    "config_from_args",
    "default_of",
    "describe_config",
    "field_docs",
    "field_meta",
    "field_types",
    "parse_text",
    "validate",
]

_BOUNDS = ("min", "max", "gt", "lt")


def bounded(default: Any = dataclasses.MISSING, *, min: float | None = None, max: float | None = None,
            gt: float | None = None, lt: float | None = None, **kwargs: Any) -> Any:
    """A dataclass field with range bounds for `validate`: ``min <= x <= max``, ``gt < x < lt`` (None: no bound)."""
    bounds = {k: v for k, v in (("min", min), ("max", max), ("gt", gt), ("lt", lt)) if v is not None}
    return dataclasses.field(default=default, metadata=bounds, **kwargs)


# ---------------------------------------------------------------------------------------------- introspection
def config_fields(cls_or_obj: Any) -> list[dataclasses.Field]:
    """The init fields of a config dataclass, in declaration order."""
    return [f for f in dataclasses.fields(cls_or_obj) if f.init]


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    """Resolved annotations of `cls`'s fields (strings from ``from __future__ import annotations`` evaluated)."""
    return typing.get_type_hints(cls)


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of `cls`'s fields: the string literal right after each field, dedented. A field a
    subclass re-declares without a docstring keeps the nearest base class's one."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):  # no source (e.g. built in a REPL): no docs
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, nxt in zip(body, body[1:], strict=False):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str)):
                docs[node.target.id] = inspect.cleandoc(nxt.value.value)
    return docs


@functools.cache
def field_meta(cls: type, name: str) -> dict[str, Any]:
    """The metadata of field `name`, merged along the MRO (a re-declared field keeps its base's bounds unless it
    declares its own)."""
    meta: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        f = getattr(klass, "__dataclass_fields__", {}).get(name)
        if f is not None:
            meta.update(f.metadata)
    return meta


def default_of(f: dataclasses.Field) -> Any:
    """A field's default value (a fresh one for ``default_factory`` fields)."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


# ---------------------------------------------------------------------------------------------- types
def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)


def _describe(tp: Any) -> str:
    """'a float', "one of 'a', 'b'", 'an int or null', ... for messages."""
    if tp is type(None):
        return "null"
    if _is_union(tp):
        return " or ".join(_describe(a) for a in typing.get_args(tp))
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if tp is bool:
        return "a bool (true or false)"
    if tp is int:
        return "an int"
    if tp is float:
        return "a float"
    if tp is str:
        return "a string"
    if tp is dict or origin is dict:
        return "a JSON object"
    if tp in (tuple, list) or origin in (tuple, list):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        inner = f" of {_describe(args[0]).removeprefix('a ').removeprefix('an ')}s" if len(set(args)) == 1 else ""
        return f"a list{inner}"
    return getattr(tp, "__name__", str(tp))


class _Mismatch(Exception):
    pass


def _coerce(value: Any, tp: Any) -> Any:
    """`value` as type `tp` (ints are floats, lists are tuples), or raise _Mismatch."""
    if tp is Any:
        return value
    if tp is type(None):
        if value is None:
            return None
        raise _Mismatch
    if _is_union(tp):
        for arg in typing.get_args(tp):
            try:
                return _coerce(value, arg)
            except _Mismatch:
                pass
        raise _Mismatch
    origin = typing.get_origin(tp)
    if origin is Literal:
        for allowed in typing.get_args(tp):
            if value == allowed and type(value) is type(allowed):
                return value
        raise _Mismatch
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _Mismatch
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _Mismatch
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise _Mismatch
    if tp is str:
        if isinstance(value, str):
            return value
        raise _Mismatch
    if tp is dict or origin is dict:
        if isinstance(value, dict):
            return value
        raise _Mismatch
    if tp in (tuple, list) or origin in (tuple, list):
        if not isinstance(value, tuple | list):
            raise _Mismatch
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        items = [_coerce(v, args[0]) for v in value] if len(set(args)) == 1 else list(value)
        return tuple(items) if (tp is tuple or origin is tuple) else items
    if isinstance(tp, type):
        if isinstance(value, tp):
            return value
        raise _Mismatch
    return value  # an annotation this validator does not know: left to the config's own checks


def _bounds_text(meta: dict) -> str:
    lo = ("[", meta["min"]) if "min" in meta else ("(", meta["gt"]) if "gt" in meta else None
    hi = (meta["max"], "]") if "max" in meta else (meta["lt"], ")") if "lt" in meta else None
    if lo and hi:
        return f"a value in {lo[0]}{lo[1]}, {hi[0]}{hi[1]}"
    if lo:
        return f"a value {'>=' if lo[0] == '[' else '>'} {lo[1]}"
    assert hi is not None, meta  # the caller passes a field with at least one bound
    return f"a value {'<=' if hi[1] == ']' else '<'} {hi[0]}"


def _in_bounds(value: Any, meta: dict) -> bool:
    return not (("min" in meta and value < meta["min"]) or ("max" in meta and value > meta["max"])
                or ("gt" in meta and value <= meta["gt"]) or ("lt" in meta and value >= meta["lt"]))


def check_field(cls: type, name: str, value: Any) -> Any:
    """`value` checked (and coerced: int -> float, list -> tuple) for field `name` of `cls`; raises ConfigError."""
    tp, given = field_types(cls)[name], value
    try:
        value = _coerce(value, tp)
    except _Mismatch:
        raise ConfigError(f"{name}: expected {_describe(tp)}, got {given!r}") from None
    meta = {k: v for k, v in field_meta(cls, name).items() if k in _BOUNDS}
    if meta and isinstance(value, int | float) and not isinstance(value, bool) and not _in_bounds(value, meta):
        raise ConfigError(f"{name}: expected {_bounds_text(meta)}, got {given!r}")
    return value


def validate(config: Any) -> None:
    """Check every field of the dataclass instance `config` against its annotation and bounds (see module
    docstring); ints given for floats become floats and lists given for tuples become tuples, in place."""
    cls = type(config)
    for f in config_fields(config):
        value = getattr(config, f.name)
        checked = check_field(cls, f.name, value)
        if checked is not value:
            object.__setattr__(config, f.name, checked)


# ---------------------------------------------------------------------------------------------- keyword options
#: accepted by every env constructor but not what a message about a misspelled option should list
_UNLISTED = frozenset({"render_mode", "config"})


@functools.cache
def _option_spec(func: Any, config: type | None) -> tuple[dict[str, tuple[Any, dict]], bool]:
    """Option name -> (annotation, bounds) of `func`'s keyword parameters and `config`'s fields, and whether
    `func` takes any other keyword (``**kwargs`` not passed on to `config`)."""
    spec: dict[str, tuple[Any, dict]] = {}
    open_ended = False
    if config is not None:  # first: where a constructor passes its options on, they are what it documents
        for f in config_fields(config):
            meta = {k: v for k, v in field_meta(config, f.name).items() if k in _BOUNDS}
            spec[f.name] = (field_types(config)[f.name], meta)
    if func is not None:
        try:
            hints = typing.get_type_hints(func)
        except Exception:  # an annotation only a type checker can resolve: resolve the others one by one
            hints = {}
            for name, ann in getattr(func, "__annotations__", {}).items():
                try:
                    hints[name] = eval(ann, func.__globals__) if isinstance(ann, str) else ann  # noqa: S307
                except Exception:
                    hints[name] = Any
        for i, p in enumerate(inspect.signature(func).parameters.values()):
            if p.kind is p.VAR_KEYWORD:
                open_ended = config is None
            elif p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and not (i == 0 and p.name == "self"):
                spec.setdefault(p.name, (hints.get(p.name, Any), {}))
    return spec, open_ended


def check_options(owner: str, options: dict, *, func: Any = None, config: type | None = None) -> None:
    """Raise a one-line `ConfigError` unless every key of `options` names a keyword parameter of `func` or a field
    of the config dataclass `config`, and its value has the declared type (and the field's `bounded` range). The
    message names `owner` (e.g. the env id), the option and what it accepts; an unknown name gets the closest valid
    one. Values are only checked, not converted: numpy scalars count as the Python number they hold."""
    import difflib

    import numpy as np

    spec, open_ended = _option_spec(func, config)
    for name, value in options.items():
        if name not in spec:
            if open_ended:
                continue
            valid = [n for n in spec if n not in _UNLISTED]
            close = difflib.get_close_matches(str(name), valid, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{owner} has no option {name!r}; valid options: {', '.join(valid)}{hint}")
        tp, meta = spec[name]
        plain = value.item() if isinstance(value, np.generic) else value
        try:
            checked = _coerce(plain, tp)
        except _Mismatch:
            raise ConfigError(f"{owner} option {name}: expected {_describe(tp)}, got {value!r}") from None
        if meta and isinstance(checked, int | float) and not isinstance(checked, bool) and not _in_bounds(checked,
                                                                                                          meta):
            raise ConfigError(f"{owner} option {name}: expected {_bounds_text(meta)}, got {value!r}")


def checked_options(owner: str, *, config: type | None = None):
    """Decorator for a constructor taking keyword options (an env's ``__init__``): `check_options` runs on the
    keywords of every call before the body, against the signature and, for ``**kwargs``, the fields of `config`.
    A misspelled or wrongly typed option is then a `ConfigError` saying what to change, not a ``TypeError`` from
    Python or from deep inside the constructor. The wrapper keeps the signature and has ``check_options(options)``
    to check options without constructing anything."""

    def decorate(init):
        def check(options: dict) -> None:
            check_options(owner, options, func=init, config=config)

        @functools.wraps(init)
        def wrapper(self, *args, **kwargs):
            check(kwargs)
            return init(self, *args, **kwargs)

        wrapper.check_options = check
        return wrapper

    return decorate


# ---------------------------------------------------------------------------------------------- text -> value
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def _parse(text: str, tp: Any, name: str) -> Any:
    if tp is Any:
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text
    if _is_union(tp):
        args = typing.get_args(tp)
        if type(None) in args and text.strip().lower() in ("none", "null"):
            return None
        for arg in (a for a in args if a is not type(None)):
            try:
                return _parse(text, arg, name)
            except _Mismatch:
                pass
        raise _Mismatch
    origin = typing.get_origin(tp)
    if origin is Literal:
        for allowed in typing.get_args(tp):
            if text == str(allowed) or (isinstance(allowed, bool) and text.lower() == str(allowed).lower()):
                return allowed
        raise _Mismatch
    if tp is bool:
        low = text.strip().lower()
        if low in _TRUE or low in _FALSE:
            return low in _TRUE
        raise _Mismatch
    if tp is int:
        try:
            return int(text)
        except ValueError:
            raise _Mismatch from None
    if tp is float:
        try:
            return float(text)
        except ValueError:
            raise _Mismatch from None
    if tp is str:
        return text
    if tp is dict or origin is dict:
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{name}: not valid JSON ({exc.msg} at character {exc.pos} of {text!r}); "
                              "write a JSON object, e.g. '{\"k\": 20}'") from None
        if not isinstance(value, dict):
            raise _Mismatch
        return value
    if tp in (tuple, list) or origin in (tuple, list):
        if text.lstrip().startswith("["):
            try:
                value = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{name}: not valid JSON ({exc.msg} at character {exc.pos} of {text!r}); "
                                  "write a JSON list or comma-separated values") from None
            return _coerce(value, tp)
        args = tuple(a for a in typing.get_args(tp) if a is not Ellipsis)
        inner = args[0] if len(set(args)) == 1 else str
        items = [_parse(part.strip(), inner, name) for part in text.split(",") if part.strip()]
        return tuple(items) if (tp is tuple or origin is tuple) else items
    try:
        return _coerce(json.loads(text), tp)
    except json.JSONDecodeError:
        return _coerce(text, tp)


def parse_text(name: str, text: str, tp: Any) -> Any:
    """A command-line string as a value of annotation `tp` (bools: true/false/yes/no/1/0; ``X | None``: none/null;
    dicts: a JSON object; tuples: a JSON list or comma-separated values). Raises ConfigError naming `name`."""
    try:
        return _parse(text, tp, name)
    except _Mismatch:
        raise ConfigError(f"{name}: expected {_describe(tp)}, got {text!r}") from None


# ---------------------------------------------------------------------------------------------- argparse
def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _arg_type(cls: type, name: str, tp: Any):
    def convert(text: str) -> Any:
        try:
            return check_field(cls, name, parse_text(name, text, tp))
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix(f"{name}: ")) from None

    convert.__name__ = _describe(tp)  # argparse names the type in its own messages
    return convert


def add_config_arguments(parser: argparse.ArgumentParser | Any, cls: type, *, exclude: Iterable[str] = ()
                         ) -> list[str]:
    """Add one ``--field-name`` option per field of config dataclass `cls` (except `exclude`) to `parser`:
    its type, its choices (Literal), its default and its docstring as help. Bools become ``--x/--no-x``. Returns
    the field names added (`config_from_args` reads them back)."""
    exclude = set(exclude)
    docs, hints = field_docs(cls), field_types(cls)
    added = []
    for f in config_fields(cls):
        if f.name in exclude:
            continue
        tp, default = hints[f.name], default_of(f)
        doc = " ".join(docs.get(f.name, "").split()).replace("%", "%%")
        if default is None:  # None means "decided elsewhere": the docstring says how
            help_text = doc
        else:
            shown = ",".join(map(str, default)) if isinstance(default, tuple) else \
                json.dumps(default) if isinstance(default, dict) else default
            help_text = f"{doc} (default: {shown})"
        kwargs: dict[str, Any] = {"dest": f.name, "default": default, "help": help_text}
        base = [a for a in typing.get_args(tp) if a is not type(None)] if _is_union(tp) else [tp]
        if base == [bool]:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = _arg_type(cls, f.name, tp)
            lits = typing.get_args(base[0]) if len(base) == 1 and typing.get_origin(base[0]) is Literal else ()
            kwargs["metavar"] = "{" + ",".join(map(str, lits)) + "}" if lits else f.name.upper()
        parser.add_argument(_flag(f.name), **kwargs)
        added.append(f.name)
    return added


def config_from_args(cls: type, args: argparse.Namespace, names: Iterable[str] | None = None, **extra: Any) -> Any:
    """Build `cls` from the options `add_config_arguments` added (all fields found on `args`, or `names`),
    plus `extra` keyword values."""
    names = [f.name for f in config_fields(cls) if hasattr(args, f.name)] if names is None else list(names)
    return cls(**{n: getattr(args, n) for n in names}, **extra)


def describe_config(cls: type, *, width: int = 100) -> str:
    """The fields of `cls` with their types, defaults, bounds and docs, one block per field."""
    docs, hints = field_docs(cls), field_types(cls)
    lines = [f"{cls.__module__}.{cls.__qualname__}"]
    doc = inspect.getdoc(cls)
    if doc and not doc.startswith(cls.__name__ + "("):  # dataclass's generated signature is noise
        lines += [textwrap.fill(doc.split("\n\n")[0], width)]
    for f in config_fields(cls):
        meta = {k: v for k, v in field_meta(cls, f.name).items() if k in _BOUNDS}
        default = default_of(f)
        head = f"{f.name} = {json.dumps(default) if isinstance(default, dict) else repr(default)}"
        head += f"    ({_describe(hints[f.name])}" + (f", {_bounds_text(meta)}" if meta else "") + ")"
        lines += ["", head]
        text = " ".join(docs.get(f.name, "").split())
        if text:
            lines += textwrap.wrap(text, width - 4, initial_indent="    ", subsequent_indent="    ")
    return "\n".join(lines)

"""Short, human messages for pydantic validation errors.

Pydantic's messages are written for Python developers ("Input should be a valid
integer, unable to parse string as an integer"). A spec file's reader wants
"expected an integer, got 'two'". :func:`issue_parts` turns one pydantic error
into a key path and such a message; :func:`format_path` renders the path as
``hosts[1].slots``.
"""

from __future__ import annotations

import datetime
import difflib
import re
import types
import typing
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel
from pydantic_core import ErrorDetails

from dmlctl.spec.fields import NAME_PATTERN, shown
from dmlctl.spec.yamlpos import KeyPath

_KEY_MARKER = "[key]"

_EXPECTED = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "a string",
    "list_type": "a list",
    "tuple_type": "a list",
    "set_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "dataclass_type": "a mapping",
    "finite_number": "a finite number",
}

_PATTERN_RULES = {
    NAME_PATTERN: "may contain only letters, digits, '.', '_' and '-' (first: letter or digit)",
}

_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_.-]{1,40}$")

_BOUNDS = {
    "greater_than": ">",
    "greater_than_equal": ">=",
    "less_than": "<",
    "less_than_equal": "<=",
}


def describe(value: Any) -> str:
    """How a YAML value reads in a message: ``'two'``, ``2.5``, ``true``, ``a list``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return shown(value)
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**15:
        return f"a number of about {int(value.bit_length() * 0.30103) + 1} digits"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, datetime.date):
        return f"a date ({value.isoformat()})"
    if isinstance(value, bytes):
        return "binary data"
    return f"a {type(value).__name__}"


def format_path(path: KeyPath, *, ends_in_key: bool = False) -> str:
    """``('hosts', 1, 'slots')`` -> ``hosts[1].slots``.

    Integers are list indexes, except the last part when ``ends_in_key`` says it is
    a mapping key (``env: {3: x}`` -> ``env.3``).
    """
    out = ""
    for index, part in enumerate(path):
        is_key = ends_in_key and index == len(path) - 1
        if isinstance(part, int) and not isinstance(part, bool) and not is_key:
            out += f"[{part}]"
        else:
            text = str(part) if _PLAIN_KEY.match(str(part)) else shown(str(part))
            out += f".{text}" if out else text
    return out


def did_you_mean(key: object, valid: Sequence[str]) -> str:
    """``unknown key 'wrokers'; did you mean 'workers'?`` (or the list of valid keys)."""
    quoted = describe(key)
    text = str(key) if isinstance(key, str) and len(key) <= 100 else ""
    close = difflib.get_close_matches(text, valid, n=1, cutoff=0.6) if text else []
    if close:
        return f"unknown key {quoted}; did you mean {close[0]!r}?"
    return f"unknown key {quoted}; valid keys: {', '.join(valid)}"


def is_key_error(error: ErrorDetails) -> bool:
    """True when ``error`` is about a mapping key itself (not the value under it)."""
    loc = error["loc"]
    return error["type"] == "invalid_key" or (bool(loc) and loc[-1] == _KEY_MARKER)


def issue_parts(error: ErrorDetails, model: type[BaseModel]) -> tuple[KeyPath, str]:
    """Key path and short message for one error of ``model.model_validate``.

    The path never contains pydantic's internal markers; for a missing key it is
    the missing key's path (the caller reports it at the parent's line); for an
    error about a key (:func:`is_key_error`) it ends with that key.
    """
    kind = error["type"]
    loc = tuple(error["loc"])
    value = error.get("input")
    ctx = error.get("ctx") or {}
    is_key = bool(loc) and loc[-1] == _KEY_MARKER
    path: KeyPath = loc[:-1] if is_key else loc

    if kind == "missing":
        return path, "required key missing"
    if kind == "extra_forbidden":
        return path, did_you_mean(path[-1], field_names(model, path[:-1]))
    if kind == "invalid_key" or (is_key and kind == "string_type"):
        return path, f"keys must be strings, got {describe(value)}; quote it"
    if kind == "string_pattern_mismatch" and is_key:
        return path, (
            f"{describe(value)} is not a valid environment variable name "
            "(letters, digits and _, not starting with a digit)"
        )
    if kind == "string_pattern_mismatch":
        rule = _PATTERN_RULES.get(str(ctx.get("pattern")), f"must match {ctx.get('pattern')}")
        return path, f"{rule}, got {describe(value)}"
    if kind in _EXPECTED:
        message = f"expected {_EXPECTED[kind]}, got {describe(value)}"
        if kind == "string_type" and not isinstance(value, dict | list):
            message += "; quote it"
        return path, message
    if kind in _BOUNDS:
        bound = next(iter(ctx.values()), "?")
        return path, f"must be {_BOUNDS[kind]} {bound}, got {describe(value)}"
    if kind == "string_too_short":
        least = ctx.get("min_length", 1)
        return path, "must not be empty" if least <= 1 else f"needs at least {least} characters"
    if kind == "string_too_long":
        size = len(value) if isinstance(value, str) else "?"
        return path, f"is too long ({size} characters; at most {ctx.get('max_length', '?')})"
    if kind == "too_short" and path == ("hosts",):
        return path, "no hosts; list at least one machine (e.g. '- address: gpu1')"
    if kind == "too_short":
        return path, f"must have at least {ctx.get('min_length', 1)} item(s)"
    if kind == "too_long":
        return path, f"must have at most {ctx.get('max_length', '?')} item(s)"
    if kind == "literal_error":
        return path, f"expected one of {ctx.get('expected', '?')}, got {describe(value)}"
    if kind == "value_error":
        return path, str(ctx.get("error", error["msg"]))
    # Custom errors raised by our own validators already read well; pydantic's own
    # start with a capital ("Input should be ...") that reads odd after "path: ".
    message = error["msg"]
    if message[:1].isupper() and message[1:2].islower():
        message = message[:1].lower() + message[1:]
    return path, message


def field_names(model: type[BaseModel], path: Iterable[str | int]) -> list[str]:
    """Field names of the model found at ``path`` below ``model`` (``[]`` if none)."""
    annotation: Any = model
    for part in path:
        annotation = _step(annotation, part)
        if annotation is None:
            return []
    annotation = _unwrap(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return list(annotation.model_fields)
    return []


def _step(annotation: Any, part: str | int) -> Any:
    annotation = _unwrap(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        info = annotation.model_fields.get(str(part))
        return info.annotation if info is not None else None
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (list, tuple, set, frozenset) and args and isinstance(part, int):
        return args[0]
    if origin is dict and len(args) == 2:
        return args[1]
    return None


def _unwrap(annotation: Any) -> Any:
    """Strip ``Annotated[...]`` and ``X | None`` down to ``X``."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            members = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(members) != 1:
                return annotation
            annotation = members[0]
        else:
            return annotation

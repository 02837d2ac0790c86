"""Plain scalars read as YAML 1.2 reads them, and refused where YAML 1.1 reads them
otherwise.

PyYAML implements YAML 1.1: ``010`` is 8, ``1_000`` is 1000, ``yes`` and ``on`` are
true, ``1:30`` is 90 and ``1e9`` is the text ``1e9``. YAML 1.2 (its core schema) reads
``010`` as 10 and the others as text, except ``1e9``, a number. A spec file means one
thing, whichever YAML its author learnt: a plain (unquoted) scalar that the two read
differently is refused with the way to write it, but where the difference is only
that 1.2 reads a number PyYAML misses (``1e9``, ``0o17``) or text 1.1 would count in
base 60 (``1:30``), which are read as 1.2 does.
"""

from __future__ import annotations

import re

_NULL = "tag:yaml.org,2002:null"
_BOOL = "tag:yaml.org,2002:bool"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_STR = "tag:yaml.org,2002:str"

_CORE: tuple[tuple[str, re.Pattern[str]], ...] = (
    (_NULL, re.compile(r"~|null|Null|NULL|")),
    (_BOOL, re.compile(r"true|True|TRUE|false|False|FALSE")),
    (_INT, re.compile(r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+")),
    (
        _FLOAT,
        re.compile(
            r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?"
            r"|[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN)"
        ),
    ),
)
"""YAML 1.2's core schema: the tag of a plain scalar, by the first that matches."""

_YAML11_BOOL = re.compile(r"yes|Yes|YES|no|No|NO|on|On|ON|off|Off|OFF|y|Y|n|N")


class Ambiguous(ValueError):
    """A plain scalar YAML 1.1 and 1.2 read differently; the message says how to write
    it so that both read it the same."""


def core_tag(value: str) -> str:
    """The tag YAML 1.2's core schema gives the plain scalar ``value``."""
    for tag, pattern in _CORE:
        if pattern.fullmatch(value):
            return tag
    return _STR


def resolve(value: str, tag: str) -> str:
    """The tag to read the plain scalar ``value`` with, which PyYAML (YAML 1.1) tagged
    ``tag``: YAML 1.2's; :class:`Ambiguous` where the two read it as different values
    and neither reading is plainly meant (see the module docstring)."""
    wanted = core_tag(value)
    if wanted == _INT and re.fullmatch(r"[-+]?0[0-9]+", value):
        digits = value.lstrip("+-").lstrip("0") or "0"
        old = "text" if tag == _STR else "an octal number"
        raise Ambiguous(
            f"{value!r} is {digits} in YAML 1.2 and {old} in YAML 1.1: write {digits} for "
            "the number, or quote it for the text"
        )
    if tag == wanted or tag not in (_NULL, _BOOL, _INT, _FLOAT):
        return wanted if tag in (_NULL, _BOOL, _INT, _FLOAT, _STR) else tag
    if tag == _BOOL and _YAML11_BOOL.fullmatch(value):
        truth = "true" if value.lower() in ("yes", "on", "y") else "false"
        raise Ambiguous(
            f"{value!r} is {truth} in YAML 1.1 and the text {value!r} in YAML 1.2: write "
            f"{truth} for the boolean, or quote it ('{value}') for the text"
        )
    if tag in (_INT, _FLOAT) and "_" in value:
        plain = value.replace("_", "")
        raise Ambiguous(
            f"{value!r} is the number {plain} in YAML 1.1 and text in YAML 1.2: write "
            f"{plain} for the number, or quote it for the text"
        )
    if tag == _INT and value.lower().lstrip("+-").startswith("0b"):
        raise Ambiguous(
            f"{value!r} is a binary number in YAML 1.1 and text in YAML 1.2: write it in "
            "decimal, or quote it for the text"
        )
    return wanted

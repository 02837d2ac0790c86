"""YAML parsing that remembers where every key and list item is.

PyYAML's ``safe_load`` throws line numbers away. Spec errors must say
``file:line key.path: message``, so this module composes the node tree with
:class:`yaml.SafeLoader`, records the 1-based line of every mapping key and sequence
item under its key path (the same tuple shape pydantic uses in ``loc``: ``str`` for
mapping keys, ``int`` for list indexes), reports duplicate keys (which ``safe_load``
silently resolves to the last one), reads plain scalars as YAML 1.2 does
(:mod:`dmlctl.spec.yaml12`) and only then constructs plain Python data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from dmlctl.spec import yaml12

KeyPath = tuple[str | int, ...]
"""A key path: mapping keys and list indexes from the document root."""

_MERGE_TAG = "tag:yaml.org,2002:merge"
_INT_TAG = "tag:yaml.org,2002:int"
_STR_TAG = "tag:yaml.org,2002:str"
_MAX_DIGITS = 1000


class YamlSyntaxError(Exception):
    """The text is not valid YAML; ``line`` is 1-based (``None`` when YAML gave none)."""

    def __init__(self, line: int | None, message: str, path: KeyPath = ()) -> None:
        self.line = line
        self.message = message
        self.path = path  # the value's key path, where one value is the problem
        super().__init__(message)


@dataclass(frozen=True)
class DuplicateKey:
    """A key that appears twice in one mapping (``line``: the repeated occurrence)."""

    path: KeyPath
    line: int
    first_line: int


@dataclass(frozen=True)
class Document:
    """A parsed YAML document.

    ``data`` is what ``yaml.safe_load`` would return (``None`` for an empty document).
    ``lines`` maps the key path of every mapping key and sequence item to the 1-based
    line where it starts; ``()`` maps to the line of the root node. Values reached
    through an alias are not descended into: their sub-paths fall back to the line
    of the key that uses the alias (see :meth:`line_of`).
    """

    data: Any
    lines: Mapping[KeyPath, int]
    duplicates: tuple[DuplicateKey, ...] = field(default=())

    def line_of(self, path: KeyPath) -> int | None:
        """Line of ``path``, or of its nearest ancestor that has one."""
        for end in range(len(path), -1, -1):
            line = self.lines.get(path[:end])
            if line is not None:
                return line
        return None


def parse(text: str) -> Document:
    """Parse one YAML document from ``text`` with positions.

    Raises :class:`YamlSyntaxError` for invalid YAML, for more than one document and
    for constructs that have no plain-data meaning (unhashable keys, unknown tags).
    Never raises anything else for any input text.
    """
    _check_flow_depth(text)
    try:
        loader = yaml.SafeLoader(text)  # its reader refuses unprintable characters
    except yaml.YAMLError as exc:
        raise YamlSyntaxError(_reader_line(text, exc), _reader_message(exc)) from None
    try:
        root = loader.get_single_node()
        if root is None:
            return Document(data=None, lines={(): 1})
        walker = _Walker(loader)
        walker.walk(root, ())
        data = loader.construct_document(root)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        raise YamlSyntaxError(line, _describe_yaml_error(exc)) from None
    except yaml.YAMLError as exc:
        raise YamlSyntaxError(None, f"invalid YAML: {exc}") from None
    except RecursionError:
        raise YamlSyntaxError(None, "invalid YAML: nested too deeply") from None
    except (ValueError, OverflowError) as exc:  # a value PyYAML's constructors cannot build
        raise YamlSyntaxError(None, f"invalid YAML: cannot read a value ({exc})") from None
    finally:
        loader.dispose()
    return Document(data=data, lines=walker.lines, duplicates=tuple(walker.duplicates))


MAX_FLOW_DEPTH = 64
"""Deepest nesting of ``[...]`` / ``{...}`` read (PyYAML's scanner takes time growing
with the square of the depth: 5000 levels cost seconds before it fails)."""


def _check_flow_depth(text: str) -> None:
    """YamlSyntaxError when ``[``/``{`` outside quotes and comments nest deeper than
    :data:`MAX_FLOW_DEPTH` (a brace in a plain scalar counts too: no spec has 64)."""
    depth = 0
    line = 1
    quote = ""
    comment = False
    previous = "\n"
    for char in text:
        if char == "\n":
            line += 1
            comment = False
        elif comment:
            pass
        elif quote:
            if char == quote and not (quote == '"' and previous == "\\"):
                quote = ""
        elif char in "\"'" and previous in " \t\n:[{,-":  # a quoted scalar starts
            quote = char
        elif char == "#" and previous in " \t\n":
            comment = True
        elif char in "[{":
            depth += 1
            if depth > MAX_FLOW_DEPTH:
                raise YamlSyntaxError(line, f"nested more than {MAX_FLOW_DEPTH} levels deep")
        elif char in "]}":
            depth = max(0, depth - 1)
        previous = char if not (previous == "\\" and char == "\\") else ""


def _reader_line(text: str, exc: yaml.YAMLError) -> int | None:
    position = getattr(exc, "position", None)
    return text.count("\n", 0, position) + 1 if isinstance(position, int) else None


def _reader_message(exc: yaml.YAMLError) -> str:
    character = getattr(exc, "character", None)
    if isinstance(character, int):
        return f"invalid YAML: control character {chr(character)!r} is not allowed"
    return "invalid YAML: unreadable text"


def _describe_yaml_error(exc: yaml.MarkedYAMLError) -> str:
    parts = [p for p in (exc.context, exc.problem) if p]
    return "invalid YAML: " + (", ".join(parts) if parts else "cannot parse")


class _Walker:
    """Records lines and duplicate keys; descends into each node at most once."""

    def __init__(self, loader: yaml.SafeLoader) -> None:
        self._loader = loader
        self._seen: set[int] = set()
        self.lines: dict[KeyPath, int] = {}
        self.duplicates: list[DuplicateKey] = []

    def walk(self, node: Node, path: KeyPath) -> None:
        self.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, ScalarNode) and node.style is None:  # plain: read as YAML 1.2
            try:
                node.tag = yaml12.resolve(node.value, node.tag)
            except yaml12.Ambiguous as exc:
                raise YamlSyntaxError(node.start_mark.line + 1, str(exc), path) from None
        if isinstance(node, ScalarNode) and node.tag == _INT_TAG and len(node.value) > _MAX_DIGITS:
            # Python refuses to read integers this long (and no spec value is one).
            line = node.start_mark.line + 1
            raise YamlSyntaxError(line, f"a number of {len(node.value)} characters is too long")
        # An alias is the same node object again: descending twice would record
        # lines of the anchor under a second path and makes "billion laughs"
        # documents exponential.
        if id(node) in self._seen:
            return
        self._seen.add(id(node))
        if isinstance(node, MappingNode):
            self._walk_mapping(node, path)
        elif isinstance(node, SequenceNode):
            for index, item in enumerate(node.value):
                self.walk(item, (*path, index))

    def _walk_mapping(self, node: MappingNode, path: KeyPath) -> None:
        first: dict[Any, int] = {}
        merges: list[Node] = []
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                merges.append(value_node)
                continue
            key = self._key(key_node)
            line = key_node.start_mark.line + 1
            if key in first:
                self.duplicates.append(DuplicateKey((*path, key), line, first[key]))
                continue
            first[key] = line
            sub: KeyPath = (*path, key)
            self.lines[sub] = line
            self.walk(value_node, sub)
        # Keys brought in by ``<<: *anchor`` are reported where the anchor defines
        # them, unless the mapping overrides them explicitly.
        for merge in merges:
            sources = merge.value if isinstance(merge, SequenceNode) else [merge]
            for source in sources:
                if isinstance(source, MappingNode):
                    for key_node, value_node in source.value:
                        key = self._key(key_node)
                        if key not in first:
                            first[key] = key_node.start_mark.line + 1
                            merged: KeyPath = (*path, key)
                            self.lines[merged] = first[key]
                            self.walk(value_node, merged)

    def _key(self, key_node: Node) -> Any:
        if isinstance(key_node, ScalarNode):
            try:
                key: Any = self._loader.construct_object(key_node)
            except yaml.YAMLError:
                return key_node.value
            # Keys are looked up in dicts; anything unhashable is YAML's to reject.
            return key if isinstance(key, str | int | float | bool) or key is None else key_node
        return key_node

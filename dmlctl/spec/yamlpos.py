"""YAML parsing that remembers where every key and list item is.

PyYAML's ``safe_load`` throws line numbers away. Spec errors must say
``file:line key.path: message``, so this module composes the node tree with
:class:`yaml.SafeLoader`, records the 1-based line of every mapping key and sequence
item under its key path (the same tuple shape pydantic uses in ``loc``: ``str`` for
mapping keys, ``int`` for list indexes), reports duplicate keys (which ``safe_load``
silently resolves to the last one) and only then constructs plain Python data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

KeyPath = tuple[str | int, ...]
"""A key path: mapping keys and list indexes from the document root."""

_MERGE_TAG = "tag:yaml.org,2002:merge"


class YamlSyntaxError(Exception):
    """The text is not valid YAML; ``line`` is 1-based (``None`` when YAML gave none)."""

    def __init__(self, line: int | None, message: str) -> None:
        self.line = line
        self.message = message
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
    loader = yaml.SafeLoader(text)
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
    finally:
        loader.dispose()
    return Document(data=data, lines=walker.lines, duplicates=tuple(walker.duplicates))


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

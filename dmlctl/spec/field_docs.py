"""What each field of a spec model or a strategy's ``Params`` means: its attribute
docstring, the string written on the line after it.

Read only when something shows it (``dmlctl strategies NAME``), from the model's
source: importing a model costs nothing for it, which every CLI call and every rank
does, while pydantic's ``use_attribute_docstrings`` would read the source as each
class is made.
"""

from __future__ import annotations

import ast
import functools
import inspect
import itertools

from pydantic import BaseModel


def field_docs(model: type[BaseModel]) -> dict[str, str]:
    """Each field of ``model`` (its bases' too) → what it means, on one line: its
    attribute docstring, or the ``description`` its ``Field`` gives; a field with
    neither is missing from the result."""
    docs: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if issubclass(cls, BaseModel) and cls is not BaseModel:
            docs.update(_attribute_docstrings(cls))
    for name, field in model.model_fields.items():
        if field.description:
            docs[name] = field.description
    return {
        name: " ".join(text.split()) for name, text in docs.items() if name in model.model_fields
    }


def _attribute_docstrings(cls: type) -> dict[str, str]:
    """``name: T = ...`` followed by a string, in the body of ``cls`` as its module's
    source defines it (none when the source cannot be read)."""
    try:
        path = inspect.getsourcefile(cls)
    except TypeError:
        return {}
    if path is None:
        return {}
    node = _classes(path).get(cls.__qualname__)
    if node is None:
        return {}
    found: dict[str, str] = {}
    for stmt, after in itertools.pairwise(node.body):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            found[stmt.target.id] = after.value.value
    return found


@functools.cache
def _classes(path: str) -> dict[str, ast.ClassDef]:
    """The top-level classes of the module at ``path`` by name (none if unreadable)."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return {}
    return {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}

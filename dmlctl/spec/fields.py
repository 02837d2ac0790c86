"""Field types and checks shared by the cluster and job models (pure, no I/O)."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, ConfigDict, StringConstraints
from pydantic_core import InitErrorDetails, PydanticCustomError, ValidationError

ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
EnvName = Annotated[str, StringConstraints(pattern=ENV_NAME_PATTERN)]
"""A valid environment variable name: letters, digits and ``_``, not starting with a digit."""

RESERVED_ENV = frozenset(
    {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}
)
"""Variables dmlctl sets for every rank; a spec may not override them (nor ``DMLCTL_*``)."""

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
"""Job and cluster names: they become parts of run ids and directory names."""

HOST_NAME_PATTERN = r"^[^\s/]+$"
"""Host names: anything without whitespace or '/' (addresses, IPv6 included, qualify)."""

FROZEN = ConfigDict(frozen=True, extra="forbid")
"""Model config of every spec model: immutable, unknown keys rejected."""

_HOST_TEXT = re.compile(r"^[^\s-][^\s]*$")


def check_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` unchanged, or a ValidationError naming every variable dmlctl reserves."""
    errors = [
        InitErrorDetails(
            type=PydanticCustomError(
                "reserved_env", "{key} is set by dmlctl for every rank; remove it", {"key": key}
            ),
            loc=(key,),
            input=key,
        )
        for key in env
        if key in RESERVED_ENV or key.startswith("DMLCTL_")
    ]
    if errors:
        raise ValidationError.from_exception_data("env", errors)
    return env


def check_host_text(value: str, what: str) -> str:
    """``value`` unchanged if usable as one ssh argument; ValueError otherwise."""
    # Addresses and user names end up in ssh connections and command lines; a leading
    # "-" would read as an option and whitespace as a second argument.
    if not _HOST_TEXT.match(value):
        raise ValueError(f"not a valid {what}: no spaces, must not start with '-'")
    return value


def check_user(value: str | None) -> str | None:
    """A user name (see :func:`check_host_text`) or ``None``."""
    return None if value is None else check_host_text(value, "user name")


def check_one_line(value: str | None) -> str | None:
    """A non-blank, single-line string (a path or pattern) or ``None``; ValueError otherwise."""
    if value is None:
        return None
    if not value.strip():
        return _fail("must not be empty or only spaces")
    if any(c in value for c in "\n\r\x00"):
        return _fail("must be a single line (no line breaks or NUL characters)")
    return value


def check_command(value: str | None) -> str | None:
    """A non-blank shell command (line breaks allowed, NUL not) or ``None``."""
    if value is None:
        return None
    if not value.strip():
        return _fail("must not be empty or only spaces; remove the key to run nothing")
    if "\x00" in value:
        return _fail("must not contain NUL characters")
    return value


def _fail(message: str) -> str:
    raise ValueError(message)


def _check_pattern(pattern: str) -> str:
    check_one_line(pattern)
    if pattern.startswith("#"):
        # gitignore would read the line as a comment and exclude nothing.
        raise ValueError(f"{pattern!r} reads as a comment in gitignore syntax; write '\\#...'")
    return pattern


ExcludePattern = Annotated[str, AfterValidator(_check_pattern)]
"""One gitignore-style pattern: single line, not blank, not a comment."""

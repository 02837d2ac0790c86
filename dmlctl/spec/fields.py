"""Field types, bounds and checks shared by the cluster and job models (pure, no I/O).

Every value a spec carries is bounded: numbers by the ``MAX_*`` limits below (the
README's reference lists them), strings by what may reach a command line, an
environment or a path. Text checks refuse, for every string of a spec:

* NUL characters (no command line, environment or path can carry one);
* lone surrogates (they cannot be encoded, so no file or process can take them);
* control characters (terminal escape sequences, DEL, C1 codes) — tabs only where a
  line may hold them, line breaks only in multi-line values (``setup``, ``args``,
  env values).
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, ConfigDict, Field, StringConstraints
from pydantic_core import InitErrorDetails, PydanticCustomError, ValidationError

from dmlctl.checkpoint_claim import SYSTEM_WHY, system_dir
from dmlctl.protocol import ENV_STRAGGLER
from dmlctl.redact import MIN_SECRET

MAX_SLOTS = 1024
"""Most worker processes on one host."""

MAX_WORKERS = 65536
"""Most workers of a job (also of parameter servers, and of all slots of a cluster)."""

MAX_HOSTS = 4096
"""Most hosts of a cluster."""

MAX_RESTARTS = 1000
"""Most restarts of either kind."""

MAX_SECONDS = 7 * 24 * 3600.0
"""Longest duration (timeouts, backoff, grace, checkpoint interval): one week."""

MAX_STEPS = 1_000_000_000
"""Largest step count (``checkpoint.every_steps``)."""

MAX_KEEP = 1000
"""Most checkpoints kept."""

MAX_NAME = 128
"""Longest job or cluster name."""

MAX_HOST_TEXT = 253
"""Longest host name or address (the DNS limit)."""

MAX_USER = 64
"""Longest SSH user name."""

MAX_PATH = 4096
"""Longest path or path pattern (Linux ``PATH_MAX``)."""

MAX_ITEMS = 1000
"""Most items of a list of strings (``args``, ``exclude``, ``server_hosts``)."""

MAX_ARG_BYTES = 128 * 1024 - 1
"""Longest single argument or ``NAME=value`` environment entry, in UTF-8 bytes:
Linux's ``MAX_ARG_STRLEN`` (32 pages) less the terminating NUL."""

MAX_COMMAND_BYTES = 512 * 1024
"""Most bytes of a job's ``env`` and ``args`` together, and of one host's ``env``.
Both together stay well under Linux's 2 MiB ``ARG_MAX`` (argv + environment of one
process), leaving room for the inherited environment and dmlctl's own variables."""

Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False, le=MAX_SECONDS)]
"""A duration in seconds that must be over zero (a timeout, a wait, an interval):
finite and at most :data:`MAX_SECONDS`."""

SecondsOrZero = Annotated[float, Field(ge=0, allow_inf_nan=False, le=MAX_SECONDS)]
"""A duration in seconds that may be zero (a grace, a wait, a cooldown): finite and at
most :data:`MAX_SECONDS`."""

ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
EnvName = Annotated[str, StringConstraints(pattern=ENV_NAME_PATTERN, max_length=256)]
"""A valid environment variable name: letters, digits and ``_``, not starting with a digit."""

RESERVED_ENV = frozenset(
    {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}
)
"""Variables dmlctl sets for every rank; a spec may not override them (nor ``DMLCTL_*``)."""

SETTABLE_DMLCTL_ENV = frozenset({ENV_STRAGGLER})
"""``DMLCTL_*`` variables a job's ``env`` may set: settings of the rank's runtime that
dmlctl does not set itself (``DMLCTL_STRAGGLER``: a benchmark's slowed last worker)."""

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
"""Job and cluster names: they become parts of run ids and directory names."""

FROZEN = ConfigDict(frozen=True, extra="forbid")
"""Model config of every spec model: immutable, unknown keys rejected. What a field
means is its attribute docstring (:func:`dmlctl.spec.field_docs.field_docs`)."""

# Host names, IPv4/IPv6 addresses (with a %zone) and ~/.ssh/config aliases: no spaces,
# no shell or path syntax, not starting with '-' (an ssh option) or '.' (a path).
_HOST_TEXT = re.compile(r"^[A-Za-z0-9_:][A-Za-z0-9_.:%-]*$")
# POSIX login names, plus '@' and '\' for directory-service users (user@domain).
_USER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@\\$-]*$")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")  # not \t \n \r
_SURROGATE = re.compile("[\ud800-\udfff]")

SHOWN = 40
"""Characters of a value quoted in a message; longer values are cut with ``...``."""


def shown(value: str, limit: int = SHOWN) -> str:
    """``value`` quoted for a message: ``repr`` (escapes control characters), at most
    ``limit`` characters of the value (``'abc...'``)."""
    return repr(value if len(value) <= limit else value[: limit - 3] + "...")


def check_text(value: str, *, multiline: bool = False) -> str:
    """``value`` unchanged if it holds no NUL, lone surrogate or control character
    (tabs are allowed, line breaks only when ``multiline``); ValueError naming the
    first offending character otherwise."""
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    if not multiline and ("\n" in value or "\r" in value):
        raise ValueError("must be a single line (no line breaks)")
    bad = _CONTROL.search(value)
    if bad is not None:
        raise ValueError(f"must not contain control characters (found {bad.group()!r})")
    if _SURROGATE.search(value):
        raise ValueError("is not valid Unicode (contains a lone surrogate)")
    return value


def _bounded(value: str, most: int, unit: str = "characters") -> str:
    size = len(value.encode("utf-8", "surrogatepass")) if unit == "bytes" else len(value)
    if size > most:
        raise ValueError(f"is too long ({size} {unit}; at most {most})")
    return value


def one_line(value: str) -> str:
    """A non-blank single line of at most :data:`MAX_PATH` characters (paths, patterns)."""
    _bounded(value, MAX_PATH)
    check_text(value)
    if not value.strip():
        raise ValueError("must not be empty or only spaces")
    return value


def check_one_line(value: str | None) -> str | None:
    """:func:`one_line` for an optional value."""
    return None if value is None else one_line(value)


def check_command(value: str | None) -> str | None:
    """A non-blank shell command (line breaks allowed) or ``None``."""
    if value is None:
        return None
    _bounded(value, MAX_ARG_BYTES, "bytes")
    check_text(value, multiline=True)
    if not value.strip():
        raise ValueError("must not be empty or only spaces; remove the key to run nothing")
    return value


def check_arg(value: str) -> str:
    """One command-line argument: any text without NUL or control characters (line
    breaks allowed), at most :data:`MAX_ARG_BYTES`."""
    _bounded(value, MAX_ARG_BYTES, "bytes")
    return check_text(value, multiline=True)


def check_host_text(value: str, what: str) -> str:
    """``value`` unchanged if usable as a host name, address or ssh-config alias."""
    _bounded(value, MAX_HOST_TEXT)
    if _HOST_TEXT.match(value):
        return value
    if value[:1] in ("-", "."):
        raise ValueError(f"not a valid {what}: must not start with {value[0]!r}")
    if any(c.isspace() for c in value):
        raise ValueError(f"not a valid {what}: no spaces, got {shown(value)}")
    raise ValueError(
        f"not a valid {what}: use letters, digits, '.', '-', '_', ':' "
        f"(a host name, IP address or ssh-config alias), got {shown(value)}"
    )


def is_host_text(value: object) -> bool:
    """Whether :func:`check_host_text` accepts ``value``."""
    return isinstance(value, str) and len(value) <= MAX_HOST_TEXT and bool(_HOST_TEXT.match(value))


def check_user(value: str | None) -> str | None:
    """An SSH user name or ``None``."""
    if value is None:
        return None
    _bounded(value, MAX_USER)
    if not _USER.match(value):
        raise ValueError(
            f"not a valid user name: letters, digits, '.', '_', '-', '@', not starting "
            f"with '-', got {shown(value)}"
        )
    return value


def check_python(value: str | None) -> str | None:
    """An interpreter: one word (a command or a path), no spaces."""
    if value is None:
        return None
    one_line(value)
    if any(c.isspace() for c in value) or value.startswith("-"):
        raise ValueError(
            f"must be one command or path (no spaces, no leading '-'), got {shown(value)}"
        )
    return value


def check_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` unchanged, or a ValidationError naming every problem: variables dmlctl
    reserves, values with NUL or control characters (line breaks and tabs are allowed),
    ``NAME=value`` entries over :data:`MAX_ARG_BYTES`; and a ValueError when all of
    them together exceed :data:`MAX_COMMAND_BYTES`."""
    errors: list[InitErrorDetails] = []
    total = 0
    for key, value in env.items():
        problem: str | None = None
        if key in RESERVED_ENV or (key.startswith("DMLCTL_") and key not in SETTABLE_DMLCTL_ENV):
            problem = f"{key} is set by dmlctl for every rank; remove it"
        else:
            size = len(key) + 1 + len(value.encode("utf-8", "surrogatepass"))
            total += size
            try:
                check_text(value, multiline=True)
                if size > MAX_ARG_BYTES:
                    raise ValueError(
                        f"is too long for an environment variable ({size} bytes with its "
                        f"name; the OS takes at most {MAX_ARG_BYTES})"
                    )
            except ValueError as exc:
                problem = str(exc)
        if problem is not None:
            errors.append(
                InitErrorDetails(
                    type=PydanticCustomError("env_value", _braces(problem)),
                    loc=(key,),
                    input=key,
                )
            )
    if errors:
        raise ValidationError.from_exception_data("env", errors)
    if total > MAX_COMMAND_BYTES:
        raise ValueError(f"is too large ({total} bytes; at most {MAX_COMMAND_BYTES} in all)")
    return env


def check_args(args: list[str]) -> list[str]:
    """``args`` unchanged unless they exceed :data:`MAX_COMMAND_BYTES` together."""
    total = sum(len(a.encode("utf-8", "surrogatepass")) + 1 for a in args)
    if total > MAX_COMMAND_BYTES:
        raise ValueError(f"are too large ({total} bytes; at most {MAX_COMMAND_BYTES} in all)")
    return args


def _braces(text: str) -> str:
    # PydanticCustomError reads braces as template fields.
    return text.replace("{", "(").replace("}", ")")


def _check_pattern(pattern: str) -> str:
    one_line(pattern)
    if pattern.startswith("#"):
        # gitignore would read the line as a comment and exclude nothing.
        raise ValueError(f"{shown(pattern)} reads as a comment in gitignore syntax; write '\\#...'")
    return pattern


OneLine = Annotated[str, AfterValidator(one_line)]
"""A non-blank single line without control characters (a path, a pattern)."""

PLACEHOLDERS = ("run_id",)
"""What ``{...}`` in a ``checkpoint.dir`` may name (replaced when the run is planned)."""


def check_placeholders(value: str) -> str:
    """``value`` unless a brace in it is not part of a known placeholder
    (:data:`PLACEHOLDERS`): a misspelt ``{runid}`` would otherwise stay literal and
    every run would share one checkpoint directory."""
    rest = value
    for name in PLACEHOLDERS:
        rest = rest.replace("{" + name + "}", "")
    if "{" not in rest and "}" not in rest:
        return value
    found = re.search(r"\{[^{}]*\}", rest)
    what = f"unknown placeholder {shown(found.group())}" if found else "a lone brace"
    known = ", ".join("{" + name + "}" for name in PLACEHOLDERS)
    raise ValueError(f"has {what}; the placeholders known are: {known}")


def check_storable(value: str) -> str:
    """``value`` unless it is (or is under) a system directory
    (:func:`dmlctl.checkpoint_claim.system_dir`; ``/dev/shm`` is allowed): ``/dev/null``
    as a checkpoint directory passed every check and failed at the first save, after
    the run had trained. A ``$`` is refused: dmlctl expands no variable in it (``~``
    is the home directory of each host)."""
    if "$" in value:
        raise ValueError(
            f"{shown(value)} holds a '$': dmlctl does not expand variables in a path; "
            "write it out, with ~ for the home directory"
        )
    if value.startswith("/") and (root := system_dir(value)) is not None:
        where = root if root == "/" else f"under {root}"
        raise ValueError(f"{shown(value)} is {where}: {SYSTEM_WHY}")
    return value


PlaceholderPath = Annotated[
    OneLine, AfterValidator(check_placeholders), AfterValidator(check_storable)
]
"""A :data:`OneLine` path whose ``{...}`` placeholders are known ones, outside the
system's directories, with no ``$``."""

Arg = Annotated[str, AfterValidator(check_arg)]
"""A command-line argument (see :func:`check_arg`)."""

SecretValue = Annotated[
    str, StringConstraints(min_length=MIN_SECRET, max_length=4096), AfterValidator(one_line)
]
"""A value a job lists as secret (``secrets:``): one line, long enough to be told from
an ordinary word (:data:`dmlctl.redact.MIN_SECRET`)."""


def _host_name(value: str) -> str:
    return check_host_text(value, "host name")


HostName = Annotated[str, AfterValidator(_host_name)]
"""A host's name as a cluster gives it (see :func:`check_host_text`)."""

ExcludePattern = Annotated[str, AfterValidator(_check_pattern)]
"""One gitignore-style pattern: single line, not blank, not a comment."""

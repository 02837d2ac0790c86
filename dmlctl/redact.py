"""Secrets kept out of what dmlctl prints and stores (torch-free, no I/O).

A value counts as secret when its variable's name says so (``*TOKEN*``,
``*PASSWORD*``, ``*SECRET*``, ``*API_KEY*`` …), when it is a long high-entropy token
(``ghp_…``, ``sk-…``, base64 or hex keys), when it is a URL with a password
(``scheme://user:pass@host``: only the password is hidden), when it follows a
secret-named flag (``--password=…`` or ``--password …``), when a shell command
assigns it to a secret-named variable (``export GITHUB_TOKEN=…``) or sends it as a
credential (``Authorization: Bearer …``), or when the job lists it (``secrets:``).
:class:`Redactor` then hides every such value as ``***`` wherever it appears in free
text (log lines, tracebacks, error messages, commands), and the password of every URL
it sees; the rest of the text stays as it was.
"""

from __future__ import annotations

import math
import re
import shlex
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

REDACTED = "***"

_SECRET_NAME = re.compile(
    r"(?i)(secret|token|passw(or)?d|passwd|api[_-]?key|access[_-]?key|credential|"
    r"private|auth|cookie|session|signature|dsn)"
)
_URL_PASSWORD = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s:/@]*):([^\s@/]+)@")
_TOKEN = re.compile(r"^[A-Za-z0-9+/=_.~-]{24,}$")
_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
_CREDENTIAL = re.compile(r"(?i)\b(?:bearer|basic|token)\s+([A-Za-z0-9._~+/=-]{6,})")
"""A credential sent in a header (``Authorization: Bearer X``, ``token X``)."""
_STRETCH = re.compile(r"[A-Za-z0-9+/=]{20,}")
_OWN = "DMLCTL_"  # dmlctl's own variables: run ids, paths, never secrets
MIN_SECRET = 6
"""Shorter values are never hidden in free text (they would hide ordinary words)."""


def secret_name(name: str) -> bool:
    """Whether a variable called ``name`` holds a secret by its name."""
    return _SECRET_NAME.search(name) is not None


def high_entropy(value: str) -> bool:
    """Whether ``value`` looks like a generated token: 24+ characters of one token-like
    run, not a path, holding a random-looking stretch of 20+ letters and digits (both,
    at least 3.5 bits of entropy per character). Names made of words and numbers
    (``distilbert-base-uncased-finetuned-sst-2-english``, ``run-2026-11-23-exp-42``)
    have no such stretch; ``ghp_…``, ``sk-…``, base64 and hex keys do."""
    if not _TOKEN.match(value) or value[0] in "/.~" or "//" in value:
        return False  # a path, not a token
    return any(_random(m.group()) for m in _STRETCH.finditer(value))


def _random(stretch: str) -> bool:
    if not (any(c.isalpha() for c in stretch) and any(c.isdigit() for c in stretch)):
        return False
    counts = Counter(stretch)
    n = len(stretch)
    return -sum(k / n * math.log2(k / n) for k in counts.values()) >= 3.5


def url_passwords(text: str) -> list[str]:
    """The passwords of every ``scheme://user:pass@host`` URL in ``text``."""
    return [m.group(2) for m in _URL_PASSWORD.finditer(text)]


def secret_values(env: Mapping[str, str]) -> list[str]:
    """The values of ``env`` to hide in free text: whole values of secret names and
    tokens, and URL passwords (see the module docstring)."""
    found = []
    for name, value in env.items():
        if name.startswith(_OWN):
            continue
        if secret_name(name) or high_entropy(value):
            found.append(value)
        else:
            found += url_passwords(value)
    return [v for v in found if len(v) >= MIN_SECRET]


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` for display: secret values replaced by ``***``, URL passwords
    hidden."""
    out = {}
    for name, value in env.items():
        if not name.startswith(_OWN) and (secret_name(name) or high_entropy(value)):
            out[name] = REDACTED
        else:
            out[name] = hide_url_passwords(value)
    return out


def _flag(arg: str) -> bool:
    """Whether ``arg`` is a secret-named flag with no value of its own (``--password``)."""
    return arg.startswith("-") and "=" not in arg and secret_name(arg)


def _after_flag(args: Sequence[str], i: int) -> bool:
    """Whether ``args[i]`` is the value of a secret-named flag before it (not itself a
    long flag: ``--no-password --lr 0.1`` hides nothing)."""
    return i > 0 and _flag(args[i - 1]) and not args[i].startswith("--")


def redact_arg(arg: str, after_flag: bool = False) -> str:
    """A command-line argument for display: ``--token=…``, a bare token, the value
    after a secret-named flag (``after_flag``) and a URL's password hidden."""
    if after_flag:
        return REDACTED
    name, sep, value = arg.partition("=")
    if sep and (secret_name(name) or high_entropy(value)):
        return f"{name}={REDACTED}"
    return REDACTED if high_entropy(arg) else hide_url_passwords(arg)


def redact_args(args: Sequence[str]) -> list[str]:
    """``args`` for display, each one as :func:`redact_arg` shows it; the value after a
    secret-named flag (``--password VALUE``) hidden too."""
    return [redact_arg(a, _after_flag(args, i)) for i, a in enumerate(args)]


def args_secrets(args: Sequence[str]) -> list[str]:
    """The secret values in command-line ``args``: what :func:`redact_args` hides."""
    found: list[str] = []
    for i, arg in enumerate(args):
        if _after_flag(args, i):
            found.append(arg)
            continue
        name, sep, value = arg.partition("=")
        if sep and (secret_name(name) or high_entropy(value)):
            found.append(value)
        elif high_entropy(arg):
            found.append(arg)
        else:
            found += url_passwords(arg)
    return [v for v in found if len(v) >= MIN_SECRET]


def command_secrets(command: str) -> list[str]:
    """The secret values in a shell command (a job's ``setup``): values assigned to a
    secret-named variable (``export GITHUB_TOKEN=…``), values of secret-named flags,
    credentials sent in a header (``Authorization: Bearer …``), tokens, URL passwords."""
    try:
        words = shlex.split(command, comments=True)
    except ValueError:  # an unbalanced quote: the words as they stand
        words = command.split()
    found = [m.group(1) for m in _CREDENTIAL.finditer(command)]
    for word in words:
        assigned = _ASSIGNMENT.match(word)
        if assigned and secret_name(assigned.group(1)):
            found.append(assigned.group(2))
    found += args_secrets([w for w in words if not _ASSIGNMENT.match(w)])
    found += url_passwords(command)
    return [v for v in dict.fromkeys(found) if len(v) >= MIN_SECRET]


def hide_url_passwords(text: str) -> str:
    """``text`` with the password of every ``scheme://user:pass@`` URL hidden."""
    if "://" not in text:
        return text
    return _URL_PASSWORD.sub(lambda m: f"{m.group(1)}:{REDACTED}@", text)


class Redactor:
    """Hides known secret values and URL passwords in free text.

    Cheap when there is nothing to hide: :meth:`text` costs a substring test when
    no secret is known; with secrets, one regular-expression search.
    """

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        values = sorted({s for s in secrets if len(s) >= MIN_SECRET}, key=len, reverse=True)
        self._known = re.compile("|".join(map(re.escape, values))) if values else None

    @classmethod
    def for_envs(cls, envs: Iterable[Mapping[str, str]], more: Iterable[str] = ()) -> Redactor:
        """A redactor for the secrets of these environments (:func:`secret_values`) and
        ``more`` values known to be secret."""
        return cls([*(v for env in envs for v in secret_values(env)), *more])

    @property
    def active(self) -> bool:
        """Whether any secret value is known (URL passwords are hidden regardless)."""
        return self._known is not None

    def text(self, text: str) -> str:
        """``text`` with every known secret and URL password replaced."""
        if self._known is not None and self._known.search(text):
            text = self._known.sub(REDACTED, text)
        return hide_url_passwords(text)

    def data(self, value: Any) -> Any:
        """JSON-like ``value`` (dicts, lists, strings) with :meth:`text` applied to every
        string in it, keys left as they are: for data that is written as YAML or JSON
        (hiding in its text would leave ``***``, a YAML alias, unquoted)."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {k: self.data(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.data(v) for v in value]
        return value

    def needed(self, text: str) -> bool:
        """Whether :meth:`text` would change ``text`` (a fast test for a batch)."""
        if "://" in text and _URL_PASSWORD.search(text):
            return True
        return self._known is not None and self._known.search(text) is not None

"""Small text helpers shared by every message dmlctl prints: wording, and making a
rank's raw line safe for a terminal."""

from __future__ import annotations

import re


def plural(count: int, noun: str, many: str | None = None) -> str:
    """``count`` and ``noun`` agreeing: ``1 host``, ``2 hosts``, ``0 hosts``;
    ``many`` is the plural of an irregular noun (default ``noun + "s"``)."""
    return f"{count} {noun if count == 1 else (many or noun + 's')}"


_CSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
"""A complete CSI sequence (colours, cursor moves): dropped, as the views draw their own."""
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""Any other C0 or C1 control character (ESC of an OSC title, ``\\x9b``, NUL): shown
escaped, never sent to the terminal."""


def clean_line(text: str) -> str:
    """What a terminal would finally show of a raw log line, on one line, safe to
    print: the last carriage-return segment (progress bars redraw with ``\\r``), CSI
    sequences (colours, cursor moves) dropped, every other control character shown
    escaped (``\\x1b]0;title\\x07``, ``\\x9b``, ``\\x00``), tabs expanded. The
    rank's log file keeps the bytes as written."""
    if "\r" in text:
        parts = [p for p in text.split("\r") if p.strip()]
        text = parts[-1] if parts else ""
    if "\x1b" in text or not text.isprintable():
        text = _CSI.sub("", text.replace("\n", " "))
        text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    return text.expandtabs(4).rstrip()


def host_port(host: str, port: int | str) -> str:
    """``host:port`` as people and URLs write it: an IPv6 address in brackets
    (``[::1]:22``), so that its colons are not read as the port's."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"

"""Bandwidths and latencies as ``dmlctl lab up`` takes them (``100mbit``, ``5ms``),
parsed strictly, and the token-bucket burst that goes with a rate. Pure."""

from __future__ import annotations

import re

from dmlctl.errors import UsageError

_RATE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(bit|kbit|mbit|gbit)\s*$", re.IGNORECASE)
_DELAY = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(us|ms|s)\s*$", re.IGNORECASE)
_BITS = {"bit": 1, "kbit": 1_000, "mbit": 1_000_000, "gbit": 1_000_000_000}
_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0}
MIN_RATE = 100_000  # bits/s: below this an SSH login alone takes too long
MAX_RATE = 100_000_000_000


def parse_bandwidth(text: str, option: str = "--bandwidth") -> int:
    """Bits per second of ``100mbit``, ``1gbit``, ``500kbit`` (tc's units, decimal);
    UsageError naming ``option`` otherwise."""
    match = _RATE.match(text)
    if match is None:
        raise UsageError(f"{option} {text!r}: expected a rate such as 100mbit, 1gbit, 500kbit")
    bits = round(float(match.group(1)) * _BITS[match.group(2).lower()])
    if not MIN_RATE <= bits <= MAX_RATE:
        raise UsageError(f"{option} {text!r}: must be between 100kbit and 100gbit")
    return bits


def parse_latency(text: str) -> float:
    """Milliseconds of ``5ms``, ``250us``, ``0.1s``; UsageError naming ``--latency``."""
    match = _DELAY.match(text)
    if match is None:
        raise UsageError(f"--latency {text!r}: expected a delay such as 5ms, 250us, 0.1s")
    ms = float(match.group(1)) * _MS[match.group(2).lower()]
    if not 0 < ms <= 10_000:
        raise UsageError(f"--latency {text!r}: must be above 0 and at most 10s")
    return ms


def burst_bytes(bits_per_s: int) -> int:
    """tbf's bucket size for a rate: 10 ms of traffic, at least 32 KiB (a bucket
    smaller than what the kernel sends per timer tick caps the rate below the goal)."""
    return max(bits_per_s // 8 // 100, 32 * 1024)


def show_rate(bits_per_s: int) -> str:
    """``100mbit``-style text of a rate (tc reads it back)."""
    for unit, size in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bits_per_s % size == 0:
            return f"{bits_per_s // size}{unit}"
    return f"{bits_per_s}bit"

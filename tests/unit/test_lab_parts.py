"""``dmlctl lab``'s pure parts: rates and delays as the options take them, the tbf
burst, and the lab's block in known_hosts (added, replaced, removed; other lines kept)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dmlctl.errors import UsageError
from dmlctl.lab import known_hosts
from dmlctl.lab.rates import burst_bytes, parse_bandwidth, parse_latency, show_rate


def test_bandwidths_in_tc_units() -> None:
    got = [parse_bandwidth(t) for t in ("100mbit", "1gbit", "500kbit", " 2.5Mbit ")]
    assert got == [100_000_000, 1_000_000_000, 500_000, 2_500_000]
    assert [show_rate(b) for b in got] == ["100mbit", "1gbit", "500kbit", "2500kbit"]
    for bad in ("100", "100mbps", "fast", "10kbit", "1000gbit", ""):
        with pytest.raises(UsageError, match="--bandwidth"):
            parse_bandwidth(bad)
    with pytest.raises(UsageError, match="--lab 'x'"):
        parse_bandwidth("x", "--lab")


def test_latencies_and_bursts() -> None:
    assert [parse_latency(t) for t in ("5ms", "250us", "0.1s")] == [5.0, 0.25, 100.0]
    for bad in ("5", "0ms", "11s", "soon"):
        with pytest.raises(UsageError, match="--latency"):
            parse_latency(bad)
    assert burst_bytes(100_000_000) == 125_000  # 10 ms at 100 Mbit/s
    assert burst_bytes(1_000_000) == 32 * 1024  # never below 32 KiB


def test_the_known_hosts_block_is_added_replaced_and_removed_alone(tmp_path: Path) -> None:
    path = tmp_path / "ssh" / "known_hosts"
    known_hosts.set_block(path, [])
    assert not path.exists()  # nothing to remove, nothing made
    known_hosts.set_block(path, ["10.231.0.2 ssh-ed25519 AAAA1"])
    assert path.stat().st_mode & 0o777 == 0o600
    path.write_text("before ssh-ed25519 B\n" + path.read_text() + "after ssh-ed25519 C")
    known_hosts.set_block(path, ["10.231.0.2 ssh-ed25519 AAAA2", "10.231.0.3 ssh-ed25519 AAAA3"])
    text = path.read_text()
    assert "AAAA1" not in text and text.count(known_hosts.BEGIN) == 1
    assert text.startswith("before ssh-ed25519 B\nafter ssh-ed25519 C\n# dmlctl lab begin\n")
    known_hosts.set_block(path, [])
    assert path.read_text() == "before ssh-ed25519 B\nafter ssh-ed25519 C\n"

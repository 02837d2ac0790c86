"""Parameter-server pieces without processes: roles from the environment, the
server's traffic statistics, the dashboard columns and the plan rendering."""

from __future__ import annotations

import pytest
from rich.console import Console

from dmlctl import protocol
from dmlctl.ps.stats import ServerStats


def test_local_role_comes_from_the_list_by_local_rank() -> None:
    env = {protocol.ENV_LOCAL_ROLES: "worker,worker,server", protocol.ENV_ROLE: "worker"}
    assert [protocol.local_role(env, i) for i in range(3)] == ["worker", "worker", "server"]
    assert protocol.local_role({protocol.ENV_ROLE: "server"}, 5) == "server"
    assert protocol.local_role({}, 0) == "worker"
    with pytest.raises(ValueError, match="LOCAL_RANK=3 has no entry"):
        protocol.local_role(env, 3)


def test_read_env_validates_the_role_against_the_strategy() -> None:
    from dmlctl.runtime.env import read_env
    from dmlctl.strategies import registry

    base = {"RANK": "2", "WORLD_SIZE": "3", "LOCAL_RANK": "2"}
    roles = {protocol.ENV_LOCAL_ROLES: "worker,worker,server"}
    env = read_env({**base, "DMLCTL_STRATEGY": "asgd", **roles}, registry.load)
    assert env.role == "server"
    with pytest.raises(ValueError, match="role 'server' is not one of strategy 'ssgd'"):
        read_env({**base, **roles}, registry.load)


def test_server_stats_window_rates_and_staleness() -> None:
    now = [100.0]
    stats = ServerStats(clock=lambda: now[0])
    for staleness in (0, 0, 1, 5):
        stats.pushed(1000, staleness)
    stats.pulled(4000)
    now[0] = 102.0
    window = stats.window()
    assert window["push_per_s"] == 2.0 and window["pull_per_s"] == 0.5
    assert window["push_bytes_per_s"] == 2000.0 and window["pull_bytes_per_s"] == 2000.0
    assert window["staleness_median"] == 0.5 and window["staleness_max"] == 5.0
    now[0] = 103.0
    empty = stats.window()  # a new window: nothing applied, so no staleness keys
    assert empty["push_per_s"] == 0.0 and "staleness_max" not in empty
    assert stats.total_pushes == 4 and stats.total_pulls == 1


def test_dashboard_shows_clock_staleness_rates_and_spread() -> None:
    from dmlctl.runs.events import MetricRecord
    from dmlctl.runs.reducer import apply
    from dmlctl.runs.state import new_run_state
    from dmlctl.ui.format import rank_table

    ranks = [(0, "a", "worker"), (1, "a", "worker"), (2, "a", "server")]
    state = new_run_state("r", "job", "ssp", ranks, 0.0)
    server = {
        "push_per_s": 120.0,
        "pull_per_s": 118.0,
        "push_bytes_per_s": 2 * 1024 * 1024,
        "pull_bytes_per_s": 3 * 1024 * 1024,
        "staleness_median": 1.0,
        "staleness_max": 3.0,
        "clock_spread": 2.0,
    }
    state = apply(
        state,
        [
            MetricRecord("a", 0, 40, {"loss": 0.5, "clock": 40.0}, 1.0),
            MetricRecord("a", 1, 38, {"loss": 0.6, "clock": 38.0}, 1.0),
            MetricRecord("a", 2, 78, server, 1.0),
        ],
    )
    console = Console(record=True, width=200, color_system=None)
    console.print(rank_table(state.ranks))
    text = console.export_text()
    for header in ("clock", "stale med/max", "push/pull per s", "in/out per s", "spread"):
        assert header in text
    assert "1/3" in text and "120.0/118.0" in text and "2.0 MiB/3.0 MiB" in text
    assert "server" in text


def test_plan_rendering_names_the_server_ranks() -> None:
    import json
    from pathlib import Path

    from dmlctl.plan.model import LaunchPlan
    from dmlctl.plan.render import render_plan

    fixture = Path(__file__).parent / "fixtures" / "plans" / "ps_dedicated_hosts" / "expected.json"
    plan = LaunchPlan.from_dict(json.loads(fixture.read_text()))
    text = render_plan(plan)
    assert "4 workers + 2 parameter servers on 3 hosts" in text
    assert "host ps-1" in text and "(parameter servers: 4, 5)" in text
    assert LaunchPlan.from_dict(plan.to_dict()) == plan

"""The run's progress and its ETA, from the ``progress`` and ``epoch`` values the
runtime adds to the workers' records (:data:`dmlctl.protocol.PROGRESS`).

Pure: a state in, numbers and text out. The run's progress is the mean over the
workers that reported one; the ETA assumes the rate since the first rank started
holds: ``elapsed · (1 − p) / p``.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.text import Text

from dmlctl.protocol import PROGRESS, ROLE_SERVER
from dmlctl.runs.state import Phase, RankState, RunState

BAR_WIDTH = 20
_EIGHTHS = " ▏▎▍▌▋▊▉"


def rank_progress(rank: RankState) -> float | None:
    """The share of its training a rank reported done (0 to 1), or None."""
    value = rank.metrics.get(PROGRESS)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return min(1.0, max(0.0, float(value)))


def run_progress(state: RunState) -> float | None:
    """The mean progress of the workers that reported one, or None; 1 once the run
    succeeded (a rank's last report may come before its last batches)."""
    values = [
        p for r in state.ranks if r.role != ROLE_SERVER and (p := rank_progress(r)) is not None
    ]
    if values and state.phase is Phase.SUCCEEDED:
        return 1.0
    return sum(values) / len(values) if values else None


def eta_seconds(state: RunState, now: float) -> float | None:
    """Seconds left at the rate so far, or None (no progress yet, or ended)."""
    done = run_progress(state)
    if done is None or done <= 0 or state.started_at is None or state.phase.terminal:
        return None
    return max(0.0, now - state.started_at) * (1.0 - done) / done


def bar(done: float, width: int = BAR_WIDTH) -> str:
    """``width`` cells filled in eighths: ``████▌     ``."""
    cells = min(1.0, max(0.0, done)) * width
    full = int(cells)
    part = _EIGHTHS[int((cells - full) * 8)] if full < width else ""
    return ("█" * full + part).ljust(width)


def progress_line(
    state: RunState, now: float, duration: Callable[[float], str], *, with_bar: bool = True
) -> Text | None:
    """``progress ▕████▌     ▏ 23%  epoch 3  ETA 0:01:12`` (``duration`` formats
    the ETA; ``with_bar=False`` leaves the bar out), or None when no worker reported
    progress."""
    done = run_progress(state)
    if done is None:
        return None
    text = Text("progress ", style="dim")
    if with_bar:
        text.append(f"▕{bar(done)}▏ ", style="cyan")
    text.append(f"{done:.0%}")
    epochs = [r.metrics.get("epoch") for r in state.ranks if r.role != ROLE_SERVER]
    numbers = [e for e in epochs if isinstance(e, int) and not isinstance(e, bool)]
    if numbers:
        text.append("  epoch ", style="dim")
        text.append(str(min(numbers)))
    eta = eta_seconds(state, now)
    if eta is not None and done < 1:
        text.append("  ETA ", style="dim")
        text.append(duration(eta))
    return text


NO_METRICS_AFTER = 30.0
"""Seconds a run trains without a metric from any rank before the views say how to
send some."""
NO_METRICS = (
    "no metrics from the ranks yet: ctx.log(step=..., loss=...) in the script, or "
    "dmlctl's callback for a Trainer, Lightning or accelerate (docs/integrations.md)"
)


def no_metrics_hint(state: RunState, now: float) -> str | None:
    """:data:`NO_METRICS` while the run has been running :data:`NO_METRICS_AFTER`
    seconds without one metric record from any rank; else None."""
    if state.phase is not Phase.RUNNING or state.started_at is None:
        return None
    if now - state.started_at < NO_METRICS_AFTER:
        return None
    if any(r.step is not None or r.metrics for r in state.ranks):
        return None
    return NO_METRICS

"""Running a benchmark as an ordinary dmlctl job and reading back what it logged.

Shared by the benches that launch dmlctl jobs: each builds a job, runs it with
:func:`launch_bench` (a real run: run directory, logs, ``dmlctl status``) and parses
the lines :func:`metric_lines` returns, never restarted (:data:`NO_RESTARTS`); the
benches that compare sides run them in turn with :func:`alternate`. Never imports
torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console

from dmlctl.errors import DmlctlError, ExitCode
from dmlctl.launch.api import LaunchOptions, LaunchResult, launch
from dmlctl.spec.models import ClusterSpec, JobSpec
from dmlctl.spec.ranks import RanksSpec
from dmlctl.spec.restart import RestartSpec

T = TypeVar("T")
Launcher = Callable[..., LaunchResult]
"""``launch``'s shape: ``(job, cluster, *, options, console) -> LaunchResult``."""
NO_RESTARTS = RestartSpec(max_user_restarts=0, max_infra_restarts=0)
"""``restart:`` of a bench job: a restarted attempt would mix two measurements."""
BENCH_RANKS: dict[str, Any] = {"start": "warm"}
"""``ranks:`` of a bench's own job unless it names one: what the benches measure is
training, not how a rank starts, and warm ranks skip their import of torch (``bench
launch`` and ``bench recovery`` measure the start, with fresh ranks unless ``--ranks``
says otherwise)."""


def with_bench_ranks(job: JobSpec) -> JobSpec:
    """``job`` with :data:`BENCH_RANKS` unless it names its ``ranks:`` itself."""
    if "ranks" in job.model_fields_set:
        return job
    return job.model_copy(update={"ranks": RanksSpec.model_validate(BENCH_RANKS)})


class BenchFailed(DmlctlError):
    """The benchmark run failed or produced no results; the message names the root cause."""


class BenchInterrupted(DmlctlError):
    """Ctrl-C (or SIGTERM) stopped a benchmark run: the whole bench ends there."""

    exit_code = ExitCode.INTERRUPTED


class BenchPartial(BenchInterrupted):
    """Ctrl-C (or SIGTERM) ended the bench after some of its runs: ``result`` is what
    the bench returns, made from the complete part of its work (every side of a
    comparison measured as often), and ``note`` says how much that is."""

    def __init__(self, note: str, result: Any) -> None:
        super().__init__(f"benchmark interrupted: {note}")
        self.note, self.result = note, result


def whole_rounds(sides: Mapping[str, list[T]]) -> dict[str, list[T]]:
    """Each side's results cut to the rounds every side finished, so a bench stopped
    mid-round compares sides measured as often (empty lists: no round is whole)."""
    rounds = min(map(len, sides.values()), default=0)
    return {side: results[:rounds] for side, results in sides.items()}


def interrupted_after(done: int, total: int) -> str:
    """``interrupted after 3 of 12 runs``: what a partial report says of itself."""
    return f"interrupted after {done} of {total} runs"


def launch_bench(
    job: JobSpec,
    cluster: ClusterSpec,
    *,
    console: Console,
    home: Path | None = None,
    launcher: Launcher = launch,
    check: bool = True,
) -> LaunchResult:
    """Run ``job`` on ``cluster`` (its ranks :func:`with_bench_ranks`) to its end without
    a live view; raises
    :class:`BenchInterrupted` when it was stopped by Ctrl-C or SIGTERM (the bench ends
    there, it does not go on) and, with ``check``, :class:`BenchFailed` naming the
    run's root cause unless it succeeded (without: whatever its outcome)."""
    try:
        result = launcher(
            with_bench_ranks(job),
            cluster,
            options=LaunchOptions(ui="quiet", home=home),
            console=console,
        )
    except KeyboardInterrupt:  # before the run's own Ctrl-C handling was set up
        raise BenchInterrupted("benchmark interrupted (Ctrl-C) while its run started") from None
    if result.exit_code == ExitCode.INTERRUPTED:
        raise BenchInterrupted(f"benchmark interrupted: run {result.run_id} was stopped")
    if check and result.exit_code != 0:
        cause = result.state.root_cause if result.state is not None else None
        why = cause.headline() if cause is not None else f"exit code {result.exit_code}"
        raise BenchFailed(
            f"benchmark run {result.run_id} failed: {why} (see `dmlctl logs {result.run_id}`)"
        )
    return result


def alternate(
    sides: Sequence[str],
    repeats: int,
    measure: Callable[[str, int], T],
    console: Console,
    *,
    warmup: bool = False,
) -> tuple[dict[str, list[T]], str | None]:
    """Measure the sides in turn, ``repeats`` rounds (``measure(side, round)``, rounds
    from 1; with ``warmup`` first an untimed round 0 whose results are dropped), so
    every side meets the same machine load; each run is said on ``console``
    (``side 2/3``). Returns each side's results in round order and None; when Ctrl-C
    stopped a run (:class:`BenchInterrupted`), the whole rounds' results and the note
    saying how much ran, or :class:`BenchInterrupted` again if no round was whole."""
    runs: dict[str, list[T]] = {side: [] for side in sides}
    first, done = (0 if warmup else 1), 0
    try:
        for round_ in range(first, repeats + 1):
            for side in sides:
                label = f"{round_}/{repeats}" if round_ else "warm-up"
                console.print(f"[dim]{side} {label}[/dim]", highlight=False)
                result = measure(side, round_)
                done += 1
                if round_:
                    runs[side].append(result)
    except BenchInterrupted:
        kept = whole_rounds(runs)
        if not kept[sides[0]]:
            raise
        return kept, interrupted_after(done, (repeats + 1 - first) * len(sides))
    return runs, None


def metric_lines(result: LaunchResult) -> list[str]:
    """The lines of the run's ``metrics.jsonl`` ([] when the run wrote none)."""
    if result.run_dir is None:
        return []
    try:
        return (result.run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []

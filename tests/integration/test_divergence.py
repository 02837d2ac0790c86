"""The divergence guard end to end: a real launch of a script with an absurd learning
rate fails (exit code 1, never a success) with ``Diverged`` as its root cause, caught
by the loss check under ssgd and by the parameter check after an averaging round
under local-sgd."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import Cli

JOBS = Path(__file__).parent / "jobs"
pytestmark = pytest.mark.integration


def _launch(cli: Cli, tmp_path: Path, strategy: str, log_every: int) -> dict[str, object]:
    """Launch ``jobs/diverge`` on 2 workers; assert it failed and return its root cause."""
    job = tmp_path / "job.yaml"
    job.write_text(
        f"script: train.py\nworkdir: {JOBS / 'diverge'}\nworkers: 2\n"
        f"args: ['--log-every', '{log_every}']\nstrategy: {strategy}\n"
    )
    proc = cli.run("launch", str(job), "--ui", "plain")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "finished training" not in proc.stdout
    state = cli.state(cli.runs()[-1].name)
    assert (state["phase"], state["exit_code"]) == ("failed", 1), state
    cause = state["root_cause"]
    assert cause["exc_type"] == "Diverged", cause
    assert f"Diverged: {cause['message']}" in proc.stdout  # the summary shows it
    return dict(cause)


def test_a_loss_that_is_not_finite_fails_the_run(cli: Cli, tmp_path: Path) -> None:
    cause = _launch(cli, tmp_path, "ssgd", log_every=1)
    assert re.fullmatch(
        r"strategy ssgd, step \d+: logged 'loss' is (inf|nan); "
        r"lower the learning rate \(lr=1e\+06\)",
        str(cause["message"]),
    ), cause


def test_parameters_that_are_not_finite_after_averaging_fail_the_run(
    cli: Cli, tmp_path: Path
) -> None:
    strategy = "{name: local-sgd, params: {period: 4}}"
    cause = _launch(cli, tmp_path, strategy, log_every=0)  # no loss logged at all
    found = re.fullmatch(
        r"strategy local-sgd, step (\d+): parameter '(weight|bias)' is not finite "
        r"after averaging \(\d+ (NaN|inf|NaN and \d+ inf) of \d+ values?\); "
        r"lower the learning rate \(lr=1e\+06\)",
        str(cause["message"]),
    )
    assert found is not None, cause
    assert int(found.group(1)) % 4 == 0  # an averaging round's step

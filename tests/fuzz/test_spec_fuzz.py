"""The spec fuzzer: hostile job files, cluster files and hostfiles given to
``dmlctl launch FILE --dry-run`` (see :mod:`tests.fuzz.specgen` for the property).

CI runs a fixed seed and a few dozen examples of each kind (a few seconds);
``DMLCTL_FUZZ_EXAMPLES=N`` runs N examples of each kind, ``DMLCTL_FUZZ_SEED`` another
seed. ``python -m tests.fuzz.run_long`` runs the long campaign and counts outcomes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from tests.fuzz import specgen

EXAMPLES = int(os.environ.get("DMLCTL_FUZZ_EXAMPLES", "0"))
SEED = int(os.environ.get("DMLCTL_FUZZ_SEED", "12"))
KINDS = {
    "job": (specgen.job_cases(), 50),
    "cluster": (specgen.cluster_cases(), 30),
    "hostfile": (specgen.hostfile_cases(), 30),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_hostile_spec_is_answered(kind: str, tmp_path: Path) -> None:
    strategy, ci_examples = KINDS[kind]
    failures: list[str] = []

    @seed(SEED)
    @settings(
        max_examples=EXAMPLES or ci_examples,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def run(case: specgen.Case) -> None:
        problems = specgen.check(case, tmp_path)
        if problems:
            failures.append(specgen.describe_failure(case, problems))

    run()
    assert not failures, "\n".join(failures[:10])


def test_the_generators_cover_both_answers() -> None:
    """Guards against a generator that only ever makes garbage (or never does)."""
    seen: set[tuple[str, str]] = set()

    @seed(SEED)
    @settings(
        max_examples=200,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.one_of(*(s for s, _ in KINDS.values())))
    def collect(case: specgen.Case) -> None:
        seen.add((case.kind, case.verdict))

    collect()
    for kind in KINDS:
        assert {(kind, "ok"), (kind, "bad")} <= seen, seen


# --------------------------------------------------------------------- real processes


def _cli(*args: str, cwd: Path, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DMLCTL_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "dmlctl", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=20,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize(
    ("role", "special"),
    [("job", "fifo"), ("cluster", "fifo"), ("job", "directory"), ("cluster", "/dev/zero")],
)
def test_special_files_are_refused_at_once(tmp_path: Path, role: str, special: str) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "job.yaml").write_text("script: train.py\n")
    target = tmp_path / "special"
    if special == "fifo":
        os.mkfifo(target)
    elif special == "directory":
        target.mkdir()
    else:
        target.symlink_to(special)
    args = ["launch", "special"] if role == "job" else ["launch", "job.yaml", "-c", "special"]
    result = _cli(*args, "--dry-run", cwd=tmp_path, home=tmp_path / "home")
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("dmlctl: special: ")
    assert "not a regular file" in result.stderr or "is a directory" in result.stderr
    assert not (tmp_path / "home").exists()


@pytest.mark.parametrize(
    "text",
    [
        "hosts:\n  - address: localhost\n    slots: 10000000\n",
        "hosts:\n  - address: localhost\n    slots: 9223372036854775808\n",
        "hosts:\n  - address: localhost\n    slots: 1e29\n",
        'hosts:\n  - address: "gpu\\x1b[2J"\n',
        "\x01\x02 garbage \x03\n",
    ],
)
def test_cluster_garbage_is_refused(tmp_path: Path, text: str) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "job.yaml").write_text("script: train.py\n")
    (tmp_path / "cluster.yaml").write_text(text)
    result = _cli(
        "launch",
        "job.yaml",
        "-c",
        "cluster.yaml",
        "--dry-run",
        cwd=tmp_path,
        home=tmp_path / "home",
    )
    assert result.returncode == 2, result.stdout + result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("dmlctl: cluster.yaml:") and len(line) <= specgen.MAX_LINE

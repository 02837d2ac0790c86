"""dmlctl.spec: models, loader messages (file:line path: message) and defaults."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from dmlctl.errors import SpecError, SpecIssue, UsageError
from dmlctl.spec import (
    BUILTIN_EXCLUDES,
    ClusterSpec,
    HostSpec,
    JobSpec,
    ResolvedHost,
    StrategySpec,
    count_local_gpus,
    default_cluster,
    load_cluster,
    load_job,
    with_rank_start,
    with_workers,
)
from dmlctl.spec.field_docs import field_docs


def write(tmp_path: Path, text: str, name: str = "job.yaml") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


Loader = Callable[[str | os.PathLike[str]], object]


def issues_of(loader: Loader, file: str | os.PathLike[str]) -> tuple[SpecIssue, ...]:
    with pytest.raises(SpecError) as info:
        loader(file)
    return info.value.issues


def only_issue(loader: Loader, file: str | os.PathLike[str]) -> SpecIssue:
    issues = issues_of(loader, file)
    assert len(issues) == 1, issues
    return issues[0]


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    return tmp_path


# --------------------------------------------------------------------------- files


def test_missing_file(tmp_path: Path) -> None:
    issue = only_issue(load_job, str(tmp_path / "nope.yaml"))
    assert (issue.line, issue.path, issue.message) == (None, "", "no such file")
    assert str(issue) == f"{tmp_path / 'nope.yaml'}: no such file"


def test_file_is_kept_as_given(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(project, "script: train.py\nworkers: 0\n")
    monkeypatch.chdir(project)
    assert only_issue(load_job, "job.yaml").file == "job.yaml"
    assert only_issue(load_job, Path("job.yaml")).file == "job.yaml"


def test_directory(tmp_path: Path) -> None:
    issue = only_issue(load_cluster, str(tmp_path))
    assert issue.line is None
    assert "is a directory" in issue.message


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable(tmp_path: Path) -> None:
    file = write(tmp_path, "script: x\n")
    os.chmod(file, 0)
    assert "permission denied" in only_issue(load_job, file).message


def test_other_os_error(tmp_path: Path) -> None:
    issue = only_issue(load_job, str(tmp_path / ("x" * 5000)))
    assert issue.message.startswith("cannot read the file")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"script: a\x00b\n", "not a text file (contains NUL bytes)"),
        (b"script: \xff\xfe\n", "not a text file (not valid UTF-8 at byte 8)"),
    ],
)
def test_binary(tmp_path: Path, data: bytes, message: str) -> None:
    path = tmp_path / "job.yaml"
    path.write_bytes(data)
    assert only_issue(load_job, str(path)).message == message


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n# another\n", "---\n"])
def test_empty(tmp_path: Path, text: str) -> None:
    issue = only_issue(load_job, write(tmp_path, text))
    assert issue.line is None
    assert issue.message.startswith("file is empty; expected a mapping with keys name, script")


def test_utf8_bom_is_accepted(project: Path) -> None:
    (project / "job.yaml").write_bytes(b"\xef\xbb\xbfscript: train.py\n")
    assert load_job(project / "job.yaml").script == "train.py"


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("script: train.py\nargs: [a, b\n", 3, "invalid YAML"),
        ("script: train.py\n  workers: 2\n", 2, "mapping values are not allowed here"),
        ("a: 1\n---\nb: 2\n", 2, "expected a single document"),
        ("script: *nowhere\n", 1, "found undefined alias"),
        ("script: !!python/object:os.system x\n", 1, "could not determine a constructor"),
        ("? [a, b]\n: 1\n", 1, "found unhashable key"),
    ],
)
def test_invalid_yaml(tmp_path: Path, text: str, line: int, fragment: str) -> None:
    issue = only_issue(load_job, write(tmp_path, text))
    assert issue.line == line
    assert issue.path == ""
    assert issue.message.startswith("invalid YAML")
    assert fragment in issue.message


@pytest.mark.parametrize(
    ("text", "line", "got"),
    [
        ("- a\n- b\n", 1, "got a list"),
        ("# c\njust a string\n", 2, "got a string ('just a string')"),
        ("42\n", 1, "got a scalar (42)"),
        ("null\n", 1, "got null"),
    ],
)
def test_top_level_not_a_mapping(tmp_path: Path, text: str, line: int, got: str) -> None:
    issue = only_issue(load_cluster, write(tmp_path, text))
    assert issue.line == line
    assert issue.message == f"expected a mapping at the top level, {got}"


# --------------------------------------------------------------------------- job fields

JOB_CASES = [
    # (yaml, line, path, message fragment)
    (
        "script: train.py\nwrokers: 2\n",
        2,
        "wrokers",
        "unknown key 'wrokers'; did you mean 'workers'?",
    ),
    ("script: train.py\nzzz: 2\n", 2, "zzz", "unknown key 'zzz'; valid keys: name, script, args"),
    ("script: train.py\nworkers: two\n", 2, "workers", "expected an integer, got 'two'"),
    ("script: train.py\nworkers: '2'\n", 2, "workers", "expected an integer, got '2'"),
    ("script: train.py\nworkers: 2.5\n", 2, "workers", "expected an integer, got 2.5"),
    ("script: train.py\nworkers: true\n", 2, "workers", "expected an integer, got true"),
    ("script: train.py\nworkers: 0\n", 2, "workers", "must be >= 1"),
    ("name: demo\n", 1, "script", "required key missing"),
    ("# header\n\nname: demo\nargs: []\n", 3, "script", "required key missing"),
    ("script: train.py\nargs: --lr\n", 2, "args", "expected a list, got '--lr'"),
    (
        "script: train.py\nargs:\n  - --lr\n  - 0.1\n",
        4,
        "args[1]",
        "expected a string, got 0.1; quote it",
    ),
    ("script: train.py\nargs: {lr: 1}\n", 2, "args", "expected a list, got a mapping"),
    ("script: train.py\nenv: [A, B]\n", 2, "env", "expected a mapping, got a list"),
    ("script: train.py\nenv:\n  SEED: 1\n", 3, "env.SEED", "expected a string, got 1; quote it"),
    (
        "script: train.py\nenv:\n  DEBUG: true\n",
        3,
        "env.DEBUG",
        "expected a string, got true; quote it",
    ),
    ("script: train.py\nenv:\n  X: null\n", 3, "env.X", "expected a string, got null"),
    (
        "script: train.py\nenv:\n  bad-key: x\n",
        3,
        "env.bad-key",
        "not a valid environment variable name",
    ),
    ("script: train.py\nenv:\n  1X: x\n", 3, "env.1X", "not a valid environment variable name"),
    ("script: train.py\nenv:\n  3: x\n", 3, "env.3", "keys must be strings, got 3"),
    ("script: train.py\nenv:\n  RANK: '1'\n", 3, "env.RANK", "RANK is set by dmlctl"),
    ("script: train.py\nenv:\n  DMLCTL_X: '1'\n", 3, "env.DMLCTL_X", "set by dmlctl"),
    ("script: train.py\nname: 'my job'\n", 2, "name", "may contain only letters"),
    ("script: train.py\n5: x\n", 2, "5", "keys must be strings, got 5"),
    (
        "script: train.py\nworkers: 1\nworkers: 2\n",
        3,
        "workers",
        "duplicate key 'workers' (first at line 2)",
    ),
    (
        "script: train.py\nstrategy: nope\n",
        2,
        "strategy.name",
        "unknown strategy 'nope' (did you mean 'none'?); valid: aadmm, adadelay, admm, asgd, "
        "bmuf, cyclades, dpsgd, easgd, easgd-async, ensemble, hogwild, local-sgd, none, ssgd, ssp, "
        "sync-ps",
    ),
    # The file has no parameter_servers: the line is the strategy's, which needs them.
    (
        "script: train.py\nstrategy: asgd\n",
        2,
        "parameter_servers",
        "strategy 'asgd' needs parameter servers: set parameter_servers to 1 or more",
    ),
    (
        "script: train.py\nparameter_servers: 2\n",
        2,
        "parameter_servers",
        "strategy 'ssgd' has no parameter servers; remove parameter_servers or use one of: "
        "aadmm, adadelay, asgd, easgd-async, ssp, sync-ps",
    ),
    (
        "script: train.py\nstrategy: ssp\nparameter_servers: -1\n",
        3,
        "parameter_servers",
        "must be >= 0, got -",
    ),
    (
        "script: train.py\nstrategy:\n  name: ssp\n  params: {staleness: -2}\n"
        "parameter_servers: 1\n",
        4,
        "strategy.params.staleness",
        "must be >= 0, got -",
    ),
    (
        "script: train.py\nstrategy:\n  name: nope\n",
        3,
        "strategy.name",
        "unknown strategy 'nope' (did you mean 'none'?); valid:",
    ),
    ("script: train.py\nstrategy: [ssgd]\n", 2, "strategy", "expected a mapping, got a list"),
    ("script: train.py\nstrategy:\n  nmae: ssgd\n", 3, "strategy.nmae", "did you mean 'name'?"),
    (
        "script: train.py\nstrategy:\n  name: ssgd\n  params:\n    bucket_cap_mbb: 1\n",
        5,
        "strategy.params.bucket_cap_mbb",
        "unknown key 'bucket_cap_mbb'; did you mean 'bucket_cap_mb'?",
    ),
    (
        "script: train.py\nstrategy:\n  params:\n    bucket_cap_mb: 0\n",
        4,
        "strategy.params.bucket_cap_mb",
        "must be > 0",
    ),
    (
        "script: train.py\nstrategy:\n  params: [1]\n",
        3,
        "strategy.params",
        "expected a mapping, got a list",
    ),
    ("script: missing.py\n", 1, "script", "no such file:"),
    ("script: ../train.py\nworkdir: sub\n", 1, "script", "must be inside workdir"),
    ("script: sub\n", 1, "script", "is a directory:"),
    ("script: train.py\nworkdir: nowhere\n", 2, "workdir", "no such directory:"),
    ("script: train.py\nworkdir: train.py\n", 2, "workdir", "not a directory:"),
    ("script: 12\n", 1, "script", "expected a string, got 12; quote it"),
    ("script: train.py\nsetup: ''\n", 2, "setup", "must not be empty"),
    ("script: train.py\nsetup: '  '\n", 2, "setup", "must not be empty"),
    ("script: train.py\nsetup: [pip install x]\n", 2, "setup", "expected a string, got a list"),
    ("script: train.py\nexclude: '*.ckpt'\n", 2, "exclude", "expected a list, got '*.ckpt'"),
    ("script: train.py\nexclude: {a: 1}\n", 2, "exclude", "expected a list, got a mapping"),
    ("script: train.py\nexclude:\n  - data/\n  - 3\n", 4, "exclude[1]", "expected a string"),
    ("script: train.py\nexclude: ['']\n", 2, "exclude[0]", "must not be empty"),
    ("script: train.py\nexclude: ['#x']\n", 2, "exclude[0]", "reads as a comment"),
    ('script: train.py\nexclude: ["a\\nb"]\n', 2, "exclude[0]", "single line"),
    ("script: train.py\nworkdir: ~no-such-user-x9\n", 2, "workdir", "no such directory"),
    (
        "script: train.py\nserver_hosts: [a]\n",
        2,
        "server_hosts",
        "strategy 'ssgd' has no parameter servers to place; remove server_hosts",
    ),
    # YAML 1.1 reads 1:30 as 90 (base 60); read as the text it is.
    ("script: train.py\nworkers: 1:30\n", 2, "workers", "expected an integer, got '1:30'"),
    (
        "script: train.py\nrestart:\n  hang_timeout: 1:30\n",
        3,
        "restart.hang_timeout",
        "expected a number, got '1:30'",
    ),
    ("script: train.py\nworkers: 1:2:3.5\n", 2, "workers", "expected an integer, got '1:2:3.5'"),
    # YAML 1.1 and 1.2 read these differently: refused, saying how to write them.
    ("script: train.py\nworkers: 010\n", 2, "workers", "'010' is 10 in YAML 1.2 and an octal"),
    ("script: train.py\nworkers: 1_000\n", 2, "workers", "write 1000 for the number"),
    ("script: train.py\nrestart:\n  standby: yes\n", 3, "restart.standby", "write true for"),
    ("script: train.py\nrestart: {standby: off}\n", 2, "restart.standby", "write false for"),
    ("script: train.py\nargs: [--x, 0b11]\n", 2, "args[1]", "quote it for the text"),
    # A misspelt placeholder would stay literal: every run would share its checkpoints.
    (
        "script: train.py\ncheckpoint:\n  dir: /ck/{runid}\n",
        3,
        "checkpoint.dir",
        "has unknown placeholder '{runid}'; the placeholders known are: {run_id}",
    ),
    ("script: train.py\ncheckpoint:\n  dir: /ck/{bogus}/x\n", 3, "checkpoint.dir", "'{bogus}'"),
    ("script: train.py\ncheckpoint:\n  dir: '/ck/{run_id'\n", 3, "checkpoint.dir", "lone brace"),
    ("script: train.py\ncheckpoint:\n  dir: /ck/}\n", 3, "checkpoint.dir", "lone brace"),
    # A device passed every check and failed at the first save, after training.
    (
        "script: train.py\ncheckpoint:\n  dir: /dev/null\n",
        3,
        "checkpoint.dir",
        "'/dev/null' is under /dev: the system keeps its files there",
    ),
    ("script: train.py\ncheckpoint:\n  dir: /etc/../usr/x\n", 3, "checkpoint.dir", "under /usr"),
    ("script: train.py\ncheckpoint:\n  dir: /\n", 3, "checkpoint.dir", "'/' is /: the system"),
    (
        "script: train.py\ncheckpoint:\n  dir: $HOME/ck\n",
        3,
        "checkpoint.dir",
        "holds a '$': dmlctl does not expand variables in a path; write it out, with ~",
    ),
    ("script: train.py\ncheckpoint:\n  dir: /proc/../proc/x\n", 3, "checkpoint.dir", "/proc"),
    ("script: train.py\ncheckpoint:\n  dir: /dev/shmem\n", 3, "checkpoint.dir", "under /dev"),
    ("script: train.py\nranks:\n  start: hot\n", 3, "ranks.start", "'fresh' or 'warm'"),
    ("script: train.py\nranks: {begin: warm}\n", 2, "ranks.begin", "start"),
]


@pytest.mark.parametrize(("text", "line", "path", "fragment"), JOB_CASES)
def test_job_issue(project: Path, text: str, line: int, path: str, fragment: str) -> None:
    (project / "sub").mkdir()
    file = write(project, text)
    issue = only_issue(load_job, file)
    assert (issue.file, issue.line, issue.path) == (file, line, path)
    assert fragment in issue.message
    assert str(issue).startswith(f"{file}:{line} {path}: ")


def test_all_issues_at_once_sorted_by_line(project: Path) -> None:
    text = (
        "script: missing.py\n"  # 1
        "strategy:\n"  # 2
        "  params:\n"  # 3
        "    bucket_cap_mbb: 1\n"  # 4
        "env:\n"  # 5
        "  A: 1\n"  # 6
        "wrokers: 2\n"  # 7
        "args: [x, 2]\n"  # 8
    )
    issues = issues_of(load_job, write(project, text))
    assert [(i.line, i.path) for i in issues] == [
        (1, "script"),
        (4, "strategy.params.bucket_cap_mbb"),
        (6, "env.A"),
        (7, "wrokers"),
        (8, "args[1]"),
    ]


def test_alias_and_merge_lines(project: Path) -> None:
    text = (
        "script: train.py\n"  # 1
        "args: &a [x, 1]\n"  # 2
        "env: &e\n"  # 3
        "  A: 'x'\n"  # 4
        "strategy:\n"  # 5
        "  params:\n"  # 6
        "    <<: {bucket_cap_mb: -1}\n"  # 7
    )
    issues = issues_of(load_job, write(project, text))
    assert [(i.line, i.path) for i in issues] == [
        (2, "args[1]"),
        (7, "strategy.params.bucket_cap_mb"),
    ]


def test_billion_laughs_is_not_expanded(project: Path) -> None:
    lines = ["script: train.py", "x0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"x{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    issues = issues_of(load_job, write(project, "\n".join(lines) + "\n"))
    assert [i.path for i in issues] == [f"x{i}" for i in range(10)]


# --------------------------------------------------------------------------- job happy paths


def test_minimal_job(project: Path) -> None:
    (project / "proj dir!").mkdir()
    job_dir = project / "proj dir!"
    (job_dir / "train.py").write_text("")
    job = load_job(write(job_dir, "script: train.py\n"))
    assert job == JobSpec(name="proj-dir-", script="train.py", workdir=str(job_dir.resolve()))
    assert job.workers is None
    assert job.strategy == StrategySpec(name="ssgd", params={})
    assert job.args == [] and job.env == {}


def test_ranks_start_fresh_unless_the_job_or_the_flag_says_warm(project: Path) -> None:
    job = load_job(write(project, "script: train.py\n"))
    assert job.ranks.start == "fresh"
    warm = load_job(write(project, "script: train.py\nranks: {start: warm}\n"))
    assert warm.ranks.start == "warm"
    assert with_rank_start(job, "warm").ranks.start == "warm"
    assert with_rank_start(warm, "fresh").ranks.start == "fresh"
    with pytest.raises(UsageError, match="--ranks must be one of fresh, warm"):
        with_rank_start(job, "hot")


def test_base_60_looking_args_stay_text(project: Path) -> None:
    job = load_job(write(project, "script: train.py\nargs: [--time, 1:30, '1:30']\n"))
    assert job.args == ["--time", "1:30", "1:30"]


def test_numbers_only_yaml_1_2_reads_are_read_as_it_does(project: Path) -> None:
    """``1e9`` (text in YAML 1.1) is a number; ``0o17`` is 15; a quoted value is text."""
    text = (
        "script: train.py\nrestart: {stop_grace: 1e2, hang_timeout: 0o17}\nargs: ['010', 'yes']\n"
    )
    job = load_job(write(project, text))
    assert (job.restart.stop_grace, job.restart.hang_timeout) == (100.0, 15)
    assert job.args == ["010", "yes"]


def test_checkpoint_dir_keeps_its_known_placeholder(project: Path) -> None:
    text = "script: train.py\ncheckpoint:\n  dir: /ck/{run_id}/x\n"
    job = load_job(write(project, text))
    assert job.checkpoint is not None and job.checkpoint.dir == "/ck/{run_id}/x"


def test_checkpoint_dir_may_be_in_shared_memory(project: Path) -> None:
    """/dev/shm is a memory filesystem: the one place under /dev that keeps files."""
    job = load_job(write(project, "script: train.py\ncheckpoint:\n  dir: /dev/shm/{run_id}\n"))
    assert job.checkpoint is not None and job.checkpoint.dir == "/dev/shm/{run_id}"


def test_full_job(project: Path) -> None:
    (project / "src" / "pkg").mkdir(parents=True)
    (project / "src" / "pkg" / "train.py").write_text("")
    text = """
name: resnet.v2
script: ./pkg/train.py
args: ["--lr", "0.1", --epochs, "5"]
workers: 4
strategy:
  name: ssgd
  params: {bucket_cap_mb: 25}
env:
  NCCL_DEBUG: INFO
  SEED: "1"
workdir: src
"""
    job = load_job(write(project, text))
    assert job.name == "resnet.v2"
    assert job.script == "pkg/train.py"
    assert job.workdir == str((project / "src").resolve())
    assert os.path.isabs(job.workdir)
    assert job.args == ["--lr", "0.1", "--epochs", "5"]
    assert job.workers == 4
    assert job.strategy == StrategySpec(name="ssgd", params={"bucket_cap_mb": 25})
    assert job.env == {"NCCL_DEBUG": "INFO", "SEED": "1"}


def test_setup_and_exclude(project: Path) -> None:
    text = (
        "script: train.py\n"
        "setup: |\n  pip install -r requirements.txt\n  pip install -e .\n"
        "exclude: [data/, '*.ckpt', '!keep.ckpt']\n"
    )
    job = load_job(write(project, text))
    assert job.setup == "pip install -r requirements.txt\npip install -e .\n"
    assert job.exclude == ["data/", "*.ckpt", "!keep.ckpt"]
    plain = load_job(write(project, "script: train.py\n"))
    assert (plain.setup, plain.exclude) == (None, [])
    assert BUILTIN_EXCLUDES == (".git/", "__pycache__/", "*.pyc", ".venv/", ".dmlctl/")
    for field in ("setup", "exclude"):
        assert field_docs(JobSpec)[field]


@pytest.mark.parametrize(
    ("text", "strategy"),
    [
        ("strategy: ssgd\n", StrategySpec(name="ssgd")),
        ("strategy: {name: ssgd, params: {}}\n", StrategySpec()),
        ("strategy: {params: {bucket_cap_mb: 25}}\n", StrategySpec(params={"bucket_cap_mb": 25})),
    ],
)
def test_strategy_forms(project: Path, text: str, strategy: StrategySpec) -> None:
    assert load_job(write(project, "script: train.py\n" + text)).strategy == strategy


def test_job_is_frozen(project: Path) -> None:
    job = load_job(write(project, "script: train.py\n"))
    with pytest.raises(ValueError, match="frozen"):
        job.workers = 3


def test_with_workers(project: Path) -> None:
    job = load_job(write(project, "script: train.py\nworkers: 2\n"))
    assert with_workers(job, 8).workers == 8
    assert job.workers == 2


def test_workers_auto_is_every_slot(project: Path) -> None:
    assert load_job(write(project, "script: train.py\nworkers: auto\n")).workers is None
    issue = only_issue(load_job, write(project, "script: train.py\nworkers: many\n"))
    assert issue.line == 2 and issue.path == "workers"


@pytest.mark.parametrize("n", [0, -1, True])
def test_with_workers_rejects(project: Path, n: int) -> None:
    job = load_job(write(project, "script: train.py\n"))
    with pytest.raises(UsageError, match="--workers must be an integer >= 1"):
        with_workers(job, n)
    assert not isinstance(UsageError("x"), SpecError)


# --------------------------------------------------------------------------- cluster

CLUSTER_CASES = [
    ("hosts: []\n", 1, "hosts", "no hosts; list at least one machine"),
    ("name: c\n", 1, "hosts", "required key missing"),
    ("hosts: {address: a}\n", 1, "hosts", "expected a list, got a mapping"),
    ("hosts:\n  - a\n", 2, "hosts[0]", "expected a mapping, got 'a'"),
    ("hosts:\n  - address: a\n  - port: 22\n", 3, "hosts[1].address", "required key missing"),
    ("hosts:\n  - address: a\n  - address: b\n    slots: 0\n", 4, "hosts[1].slots", "must be >= 1"),
    (
        "hosts:\n  - address: a\n    slots: two\n",
        3,
        "hosts[0].slots",
        "expected an integer, got 'two'",
    ),
    ("hosts:\n  - address: a\n    port: 0\n", 3, "hosts[0].port", "must be >= 1"),
    ("hosts:\n  - address: a\n    port: 65536\n", 3, "hosts[0].port", "must be <= 65535"),
    ("hosts:\n  - address: ''\n", 2, "hosts[0].address", "must not be empty"),
    ("hosts:\n  - address: -oProxyCommand=x\n", 2, "hosts[0].address", "must not start with '-'"),
    ("hosts:\n  - address: a\n    adress: b\n", 3, "hosts[0].adress", "did you mean 'address'?"),
    ("hosts:\n  - address: a\n    env: {A: 1}\n", 3, "hosts[0].env.A", "expected a string, got 1"),
    ("hosts:\n  - address: a\n  - address: a\n", 3, "hosts[1].name", "duplicate host name 'a'"),
    (
        "hosts:\n  - {name: n, address: a}\n  - {name: n, address: b}\n",
        3,
        "hosts[1].name",
        "duplicate host name 'n' (also hosts[0])",
    ),
    ("defaults:\n  slots: 0\nhosts:\n  - address: a\n", 2, "defaults.slots", "must be >= 1"),
    ("defaults:\n  slot: 2\nhosts:\n  - address: a\n", 2, "defaults.slot", "did you mean 'slots'?"),
    ("defaults: [1]\nhosts:\n  - address: a\n", 1, "defaults", "expected a mapping, got a list"),
    ("hostz:\n  - address: a\n", 1, "hostz", "did you mean 'hosts'?"),
    (
        "hosts:\n  - {name: x, address: a}\n  - {name: y, address: a}\n",
        3,
        "hosts[1].address",
        "duplicate host: same address and port as hosts[0]",
    ),
    (  # the default port is 22; addresses compare case-insensitively
        "hosts:\n  - {name: x, address: gpu1}\n  - {name: y, address: GPU1, port: 22}\n",
        3,
        "hosts[1].address",
        "duplicate host: same address and port as hosts[0]",
    ),
    (
        "defaults: {port: 2222}\nhosts:\n  - {name: x, address: a}\n  - {name: y, address: a}\n",
        4,
        "hosts[1].address",
        "same address and port as hosts[0]",
    ),
    (
        "hosts:\n  - address: a\n    identity_file: nokey\n",
        3,
        "hosts[0].identity_file",
        "no such key file: /",
    ),
    (
        "defaults:\n  identity_file: keys/id\nhosts:\n  - address: a\n",
        2,
        "defaults.identity_file",
        "no such key file: /",
    ),
    (
        "hosts:\n  - address: a\n    identity_file: .\n",
        3,
        "hosts[0].identity_file",
        "not a key file (a directory)",
    ),
    (
        "hosts:\n  - address: a\n    identity_file: ''\n",
        3,
        "hosts[0].identity_file",
        "must not be empty",
    ),
    ("hosts:\n  - address: a\n    workdir: ''\n", 3, "hosts[0].workdir", "must not be empty"),
    ("hosts:\n  - address: a\n    workdir: '  '\n", 3, "hosts[0].workdir", "must not be empty"),
    ('hosts:\n  - address: a\n    workdir: "a\\nb"\n', 3, "hosts[0].workdir", "single line"),
    (
        'defaults:\n  workdir: "w\\r"\nhosts:\n  - address: a\n',
        2,
        "defaults.workdir",
        "single line",
    ),
]


@pytest.mark.parametrize(("text", "line", "path", "fragment"), CLUSTER_CASES)
def test_cluster_issue(tmp_path: Path, text: str, line: int, path: str, fragment: str) -> None:
    file = write(tmp_path, text, "cluster.yaml")
    issues = [i for i in issues_of(load_cluster, file) if i.path != "hosts" or path == "hosts"]
    if fragment.endswith("'hosts'?"):  # the typo also leaves `hosts` missing
        issues = [i for i in issues if i.path == path]
    assert len(issues) == 1, issues
    issue = issues[0]
    assert (issue.file, issue.line, issue.path) == (file, line, path)
    assert fragment in issue.message


def test_duplicate_host_reported_with_other_host_errors(tmp_path: Path) -> None:
    text = "hosts:\n  - address: a\n  - address: a\n    slots: 0\n"
    issues = issues_of(load_cluster, write(tmp_path, text, "cluster.yaml"))
    assert [(i.line, i.path) for i in issues] == [(3, "hosts[1].name"), (4, "hosts[1].slots")]


def test_cluster_defaults_and_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home" / ".ssh").mkdir(parents=True)
    (tmp_path / "home" / ".ssh" / "lab").write_text("key\n")
    text = """
name: lab
defaults:
  user: alice
  port: 2222
  slots: 2
  env: {NCCL_IB_DISABLE: "1", A: "d"}
hosts:
  - address: gpu1.lab
  - name: big
    address: 10.0.0.2
    port: 22
    user: bob
    identity_file: ~/.ssh/lab
    slots: 8
    workdir: /scratch/w
    python: /opt/py/bin/python
    env: {A: "h"}
  - address: localhost
"""
    cluster = load_cluster(write(tmp_path, text, "cluster.yaml"))
    assert cluster.name == "lab"
    first, big, local = cluster.resolved_hosts()
    assert first == ResolvedHost(
        name="gpu1.lab",
        address="gpu1.lab",
        port=2222,
        user="alice",
        identity_file=None,
        slots=2,
        workdir="~/.dmlctl/work",
        python="python3",
        env={"NCCL_IB_DISABLE": "1", "A": "d"},
        is_local=False,
    )
    assert big == ResolvedHost(
        name="big",
        address="10.0.0.2",
        port=22,
        user="bob",
        identity_file=str(tmp_path / "home" / ".ssh" / "lab"),
        slots=8,
        workdir="/scratch/w",
        python="/opt/py/bin/python",
        env={"NCCL_IB_DISABLE": "1", "A": "h"},
        is_local=False,
    )
    assert local.is_local and local.name == "localhost"
    assert cluster.total_slots == 12


@pytest.mark.parametrize(
    ("address", "local"), [("localhost", True), ("127.0.0.1", False), ("::1", False), ("h", False)]
)
def test_is_local(address: str, local: bool) -> None:
    host = HostSpec(address=address)
    assert host.is_local is local
    assert host.name == address


def test_models_without_files() -> None:
    cluster = ClusterSpec(hosts=[HostSpec(address="a")])
    assert cluster.name == "default" and cluster.defaults.slots == 1
    with pytest.raises(ValueError, match="duplicate host name"):
        ClusterSpec(hosts=[HostSpec(address="a"), HostSpec(address="a")])
    with pytest.raises(ValueError, match="unknown strategy"):
        StrategySpec(name="nope")
    with pytest.raises(
        ValueError, match=r"unknown strategy 'local_sgd' \(did you mean 'local-sgd'\?\)"
    ):
        StrategySpec(name="local_sgd")
    with pytest.raises(ValueError, match=r"\(did you mean 'easgd-async'\?\)"):
        StrategySpec(name="EASGD_async")
    with pytest.raises(ValueError, match=r"\(did you mean 'bmuf'\?\)"):
        StrategySpec(name="bmfu")
    assert StrategySpec.model_validate("ssgd") == StrategySpec()


def test_duplicate_address_reported_with_other_host_errors(tmp_path: Path) -> None:
    text = (
        "hosts:\n"  # 1
        "  - {name: x, address: a, port: 2200}\n"  # 2
        "  - name: y\n"  # 3
        "    address: a\n"  # 4
        "    port: 2200\n"  # 5
        "    slots: 0\n"  # 6
        "    identity_file: nokey\n"  # 7
    )
    issues = issues_of(load_cluster, write(tmp_path, text, "cluster.yaml"))
    assert [(i.line, i.path) for i in issues] == [
        (4, "hosts[1].address"),
        (6, "hosts[1].slots"),
        (7, "hosts[1].identity_file"),
    ]
    assert issues[0].message == "duplicate host: same address and port as hosts[0]"


@pytest.mark.parametrize(
    "hosts",
    [
        "  - {name: x, address: a, port: 22}\n  - {name: y, address: a, port: 2222}\n",
        "  - {name: x, address: localhost}\n  - {name: y, address: localhost}\n",
        "  - {name: x, address: a}\n  - {name: y, address: a, user: bob, port: 23}\n",
    ],
)
def test_same_address_allowed(tmp_path: Path, hosts: str) -> None:
    cluster = load_cluster(write(tmp_path, "hosts:\n" + hosts, "cluster.yaml"))
    assert [h.name for h in cluster.hosts] == ["x", "y"]


def test_duplicate_address_in_models() -> None:
    with pytest.raises(ValueError, match="same address and port as hosts\\[0\\]"):
        ClusterSpec(hosts=[HostSpec(name="x", address="a"), HostSpec(name="y", address="a")])
    local = [HostSpec(name=n, address="localhost") for n in "ab"]
    assert len(ClusterSpec(hosts=local).hosts) == 2


def test_missing_key_file_names_the_absolute_path(tmp_path: Path) -> None:
    (tmp_path / "conf").mkdir()
    file = write(tmp_path / "conf", "hosts:\n  - address: a\n    identity_file: ../id\n", "c.yaml")
    issue = only_issue(load_cluster, file)
    assert str(issue) == f"{file}:3 hosts[0].identity_file: no such key file: {tmp_path / 'id'}"


def test_key_files_resolved_against_cluster_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "conf" / "keys").mkdir(parents=True)
    (tmp_path / "conf" / "keys" / "id").write_text("key\n")
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "id_home").write_text("key\n")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)  # relative to the file, not to the working directory
    text = (
        "defaults:\n  identity_file: keys/id\n"
        "hosts:\n  - address: a\n  - address: b\n    identity_file: ~/id_home\n"
    )
    cluster = load_cluster(write(tmp_path / "conf", text, "cluster.yaml"))
    a, b = cluster.resolved_hosts()
    assert cluster.defaults.identity_file == str(tmp_path / "conf" / "keys" / "id")
    assert a.identity_file == str(tmp_path / "conf" / "keys" / "id")
    assert b.identity_file == str(tmp_path / "home" / "id_home")
    assert os.path.isabs(load_cluster("conf/cluster.yaml").defaults.identity_file or "")


def test_unknown_user_in_key_file(tmp_path: Path) -> None:
    text = "hosts:\n  - address: a\n    identity_file: ~no-such-user-x9/id\n"
    issue = only_issue(load_cluster, write(tmp_path, text, "cluster.yaml"))
    assert (issue.line, issue.path) == (3, "hosts[0].identity_file")
    assert issue.message.startswith("cannot expand '~no-such-user-x9'")


@pytest.mark.parametrize("workdir", ["relative/dir", "~/w", "~alice/w", "/abs/w", "with space"])
def test_remote_workdir_kept_as_written(tmp_path: Path, workdir: str) -> None:
    text = f"hosts:\n  - address: a\n    workdir: '{workdir}'\n"
    (host,) = load_cluster(write(tmp_path, text, "cluster.yaml")).resolved_hosts()
    assert host.workdir == workdir


# --------------------------------------------------------------------------- default cluster


def test_default_cluster() -> None:
    cluster = default_cluster()
    (host,) = cluster.resolved_hosts()
    assert (host.name, host.address, host.is_local) == ("local", "localhost", True)
    assert host.slots >= 1


@pytest.fixture()
def gpus(tmp_path: Path) -> Path:
    proc = tmp_path / "gpus"
    proc.mkdir()
    for bus in ("0000:01:00.0", "0000:02:00.0", "0000:03:00.0", "0000:04:00.0"):
        (proc / bus).mkdir()
    return proc


@pytest.mark.parametrize(
    ("visible", "count"),
    [
        (None, 4),
        ("", 0),
        ("-1", 0),
        ("0", 1),
        ("0,2", 2),
        ("0, 1 ,2,3", 4),
        ("3,2,1,0,0", 4),
        ("1,7,2", 1),  # CUDA stops at the first invalid index
        ("GPU-8f6e,GPU-1a2b", 2),
        ("0,1,2,3,GPU-x", 4),  # never more than the driver has
    ],
)
def test_count_local_gpus(gpus: Path, visible: str | None, count: int) -> None:
    env = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    assert count_local_gpus(env, gpus) == count


def test_count_local_gpus_without_driver(tmp_path: Path) -> None:
    assert count_local_gpus({"CUDA_VISIBLE_DEVICES": "0"}, tmp_path / "absent") == 0


@pytest.mark.parametrize("address", ["8.8.8.8", "2001:4860:4860::8888"])
def test_a_host_at_a_public_address_is_refused_unless_the_cluster_allows_it(
    tmp_path: Path, address: str
) -> None:
    """Checked as the file is read: nothing connects to a public address first."""
    text = f"hosts:\n  - address: 10.0.0.5\n  - address: '{address}'\n"
    issue = only_issue(load_cluster, write(tmp_path, text, "cluster.yaml"))
    assert (issue.line, issue.path) == (3, "hosts[1].address")
    assert "is a public address" in issue.message and "allow_public" in issue.message
    allowed = load_cluster(write(tmp_path, "network: {allow_public: true}\n" + text, "c.yaml"))
    assert allowed.network.allow_public


def test_private_loopback_and_link_local_hosts_and_names_are_accepted(tmp_path: Path) -> None:
    hosts = ["10.1.2.3", "192.168.1.7", "172.16.0.9", "127.0.0.2", "169.254.3.4", "fd00::1"]
    hosts += ["gpu1", "node.example.com"]  # names are judged where they resolve
    text = "hosts:\n" + "".join(f"  - address: '{h}'\n" for h in hosts)
    assert len(load_cluster(write(tmp_path, text, "cluster.yaml")).hosts) == len(hosts)

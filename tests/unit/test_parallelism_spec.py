"""A job's ``parallelism:`` block and ``parallelize:`` on the control plane: every
validation rule through real job files (``file:line key: message``), the degree
check at plan time (``workers: auto``, ``--workers``), the two variables every host
gets, ``plan.json``, re-plans, and the dry run's device mesh."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from dmlctl import protocol
from dmlctl.cli.app import main
from dmlctl.errors import PlanError, SpecError
from dmlctl.mesh import MeshLayout, describe_over, layout_from, loads, worker_ranks
from dmlctl.plan.build import build_plan
from dmlctl.plan.elastic import CannotReplan, replan
from dmlctl.plan.model import LaunchPlan
from dmlctl.plan.placing import place_job
from dmlctl.plan.render import render_plan
from dmlctl.spec import load_job, with_workers
from dmlctl.spec.locate import locate
from dmlctl.spec.models import ClusterSpec, JobSpec
from dmlctl.spec.parallelism import MeshMismatch, ParallelismSpec

TP2 = "parallelism:\n  tensor_parallel_degree: 2\n"
ASGD = "strategy: asgd\nparameter_servers: 1\n"


def job_file(tmp_path: Path, text: str) -> str:
    """``text`` as ``job.yaml`` next to ``train.py`` and ``model.py``."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "model.py").write_text("def parallelize(model, mesh):\n    return model\n")
    (tmp_path / "sub").mkdir(exist_ok=True)
    path = tmp_path / "job.yaml"
    path.write_text("script: train.py\n" + text)
    return str(path)


def cluster(*slots: int) -> ClusterSpec:
    """Remote hosts ``a``, ``b``, … with these slots."""
    hosts = [
        {"name": "abcde"[i], "address": f"10.0.0.{i + 1}", "slots": n, "python": "/py"}
        for i, n in enumerate(slots)
    ]
    return ClusterSpec.model_validate({"hosts": hosts})


def plan_of(job: JobSpec, where: ClusterSpec) -> LaunchPlan:
    return build_plan(
        where, job, run_id="r", rdzv_port=29500, local_python="/py", local_run_dir="/runs/r"
    )


# ------------------------------------------------------------------ spec: every rule

SCHEDULES = (
    "GPipe, 1F1B, Interleaved1F1B, LoopedBFS, InterleavedZeroBubble, ZBVZeroBubble, DualPipeV"
)
PIPELINE_ONLY = "only applies with pipeline_parallel_degree > 1 (pipeline_parallel_degree is 1)"
NOT_STRATEGY = (
    "combines only with strategy ssgd (synchronous replicas, FSDP2 shards) or asgd "
    "(DistBelief: model-parallel replicas, asynchronous through parameter servers); "
    "strategy is "
)
EXAMPLE = "(e.g. 'model.py:parallelize')"

ISSUES = [
    # (job text after ``script:``, line, key, message)
    (
        "parallelism:\n  tensor_parallel_degree: 0\n",
        3,
        "parallelism.tensor_parallel_degree",
        "must be >= 1, got 0",
    ),
    (
        "parallelism:\n  pipeline_parallel_degree: 70000\n",
        3,
        "parallelism.pipeline_parallel_degree",
        "must be <= 65536, got 70000",
    ),
    (
        "parallelism:\n  data_parallel_shard_degree: '2'\n",
        3,
        "parallelism.data_parallel_shard_degree",
        "expected an integer, got '2'",
    ),
    (
        "parallelism:\n  data_parallel_replicate_degree: 0\n",
        3,
        "parallelism.data_parallel_replicate_degree",
        "must be -1 (the workers the other degrees leave) or >= 1, got 0",
    ),
    (
        "parallelism:\n  data_parallel_replicate_degree: -2\n",
        3,
        "parallelism.data_parallel_replicate_degree",
        "must be >= -1, got -2",
    ),
    (
        "parallelism:\n  tensor_paralel_degree: 2\n",
        3,
        "parallelism.tensor_paralel_degree",
        "unknown key 'tensor_paralel_degree'; did you mean 'tensor_parallel_degree'?",
    ),
    (
        "parallelism:\n  pipeline_parallel_degree: 2\n  pipeline_parallel_schedule: 1f1c\n",
        4,
        "parallelism.pipeline_parallel_schedule",
        f"unknown schedule '1f1c' (did you mean '1F1B'?); valid: {SCHEDULES}",
    ),
    (
        "parallelism:\n  pipeline_parallel_degree: 2\n  pipeline_parallel_schedule: zzz\n",
        4,
        "parallelism.pipeline_parallel_schedule",
        f"unknown schedule 'zzz'; valid: {SCHEDULES}",
    ),
    (
        "parallelism:\n  pipeline_parallel_degree: 2\n  pipeline_parallel_microbatches: 0\n",
        4,
        "parallelism.pipeline_parallel_microbatches",
        "must be >= 1, got 0",
    ),
    (
        "parallelism:\n  pipeline_parallel_schedule: GPipe\n",
        3,
        "parallelism.pipeline_parallel_schedule",
        PIPELINE_ONLY,
    ),
    (
        "parallelism:\n  tensor_parallel_degree: 2\n  pipeline_parallel_microbatches: 8\n",
        4,
        "parallelism.pipeline_parallel_microbatches",
        PIPELINE_ONLY,
    ),
    ("strategy: bmuf\n" + TP2, 3, "parallelism", NOT_STRATEGY + "'bmuf'"),
    (
        "strategy:\n  params: {compression: fp16}\n" + TP2,
        4,
        "parallelism",
        "combines with strategy ssgd only with compression: none (gradient compression is a "
        "DDP hook, unused on a device mesh); compression is 'fp16'",
    ),
    (
        ASGD + "parallelism: {data_parallel_shard_degree: 1}\n",
        4,
        "parallelism",
        "with strategy asgd needs tensor_parallel_degree or pipeline_parallel_degree > 1 "
        "(model parallelism inside each replica); for data parallelism alone, remove parallelism",
    ),
    (
        ASGD + TP2 + "  data_parallel_shard_degree: 2\n",
        6,
        "parallelism.data_parallel_shard_degree",
        "must be 1 with strategy asgd (each replica exchanges its parameters whole with the "
        "parameter servers)",
    ),
    (
        "parallelize: model.py:parallelize\n",
        2,
        "parallelize",
        "needs a parallelism: block (the device mesh the function parallelizes the model over)",
    ),
    (
        TP2 + "parallelize: model.py\n",
        4,
        "parallelize",
        f"must be FILE:FUNCTION {EXAMPLE}, got 'model.py'",
    ),
    (
        TP2 + "parallelize: model.txt:f\n",
        4,
        "parallelize",
        f"'model.txt' is not a .py file; expected FILE:FUNCTION {EXAMPLE}",
    ),
    (
        TP2 + "parallelize: model.py:2fast\n",
        4,
        "parallelize",
        f"'2fast' is not a Python function name; expected FILE:FUNCTION {EXAMPLE}",
    ),
    (
        TP2 + "parallelize: /abs/model.py:f\n",
        4,
        "parallelize",
        f"'/abs/model.py' must be a path relative to workdir {EXAMPLE}",
    ),
    (TP2 + "parallelize: 3\n", 4, "parallelize", "expected a string, got 3; quote it"),
]


@pytest.mark.parametrize(("text", "line", "key", "message"), ISSUES)
def test_each_rule_is_one_issue_naming_file_line_and_key(
    tmp_path: Path, text: str, line: int, key: str, message: str
) -> None:
    file = job_file(tmp_path, text)
    with pytest.raises(SpecError) as info:
        load_job(file)
    assert [str(i) for i in info.value.issues] == [f"{file}:{line} {key}: {message}"]


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("missing.py", "no such file: '{dir}/missing.py'"),
        ("sub", None),  # not .py: the model's error, not the loader's
        ("../model.py", "must be inside workdir ({dir}/sub), got '../model.py'"),
    ],
)
def test_the_parallelize_file_is_checked_like_the_script(
    tmp_path: Path, target: str, message: str | None
) -> None:
    file = job_file(tmp_path, "")
    (tmp_path / "sub" / "train.py").write_text("")
    workdir = "sub" if target.startswith("..") else "."
    text = f"script: train.py\nworkdir: {workdir}\n{TP2}parallelize: {target}:parallelize\n"
    Path(file).write_text(text)
    with pytest.raises(SpecError) as info:
        load_job(file)
    (issue,) = info.value.issues
    assert (issue.line, issue.path) == (5, "parallelize")
    if message is not None:
        assert issue.message == message.format(dir=tmp_path)


@pytest.mark.parametrize(
    ("source", "function", "message"),
    [
        ("def parallelize(model, mesh):\n    return model\n", "parallelize", None),
        (
            "def parallelize(m, mesh):\n    return m\n",
            "paralelize",
            "; did you mean 'parallelize'?",
        ),
        ("def other(m, mesh):\n    return m\n", "parallelize", ""),
        ("from lib import parallelize\n", "parallelize", None),
        ("import lib\nparallelize = lib.split\n", "parallelize", None),
        ("try:\n    import a\nexcept ImportError:\n    def f(m, mesh): ...\n", "f", None),
        ("if True:\n    def f(m, mesh): ...\nelse:\n    g = 1\n", "g", None),
        ("from lib import *\n", "anything", None),
        ("def f(:\n", "f", None),  # unparsable: running it reports the syntax error
        ("class C:\n    def parallelize(self, m, mesh): ...\n", "parallelize", ""),
    ],
)
def test_the_parallelize_function_must_be_defined_in_its_file(
    tmp_path: Path, source: str, function: str, message: str | None
) -> None:
    """Read, never imported: a FUNCTION the file does not bind at module level is a
    load error at the key's line, with a did-you-mean among the file's functions."""
    file = job_file(tmp_path, f"{TP2}parallelize: model.py:{function}\n")
    (tmp_path / "model.py").write_text(source)
    if message is None:
        load_job(file)
        return
    with pytest.raises(SpecError) as info:
        load_job(file)
    assert [str(i) for i in info.value.issues] == [
        f"{file}:4 parallelize: model.py defines no function {function!r}{message}"
    ]


def test_every_issue_at_once(tmp_path: Path) -> None:
    text = "strategy: bmuf\nparallelism:\n  tensor_parallel_degree: 0\nparallelize: x\n"
    with pytest.raises(SpecError) as info:
        load_job(job_file(tmp_path, text))
    assert [(i.line, i.path) for i in info.value.issues] == [
        (4, "parallelism.tensor_parallel_degree"),
        (5, "parallelize"),
    ]


def test_a_valid_block_is_kept_typed_and_normalised(tmp_path: Path) -> None:
    text = (
        "workers: 8\nparallelism:\n  pipeline_parallel_degree: 2\n"
        "  pipeline_parallel_schedule: interleaved1f1b\n  pipeline_parallel_microbatches: 8\n"
        "  data_parallel_shard_degree: 2\nparallelize: ./model.py:parallelize\n"
    )
    job = load_job(job_file(tmp_path, text))
    assert job.parallelism == ParallelismSpec(
        pipeline_parallel_degree=2,
        pipeline_parallel_schedule="Interleaved1F1B",
        pipeline_parallel_microbatches=8,
        data_parallel_shard_degree=2,
    )
    assert job.parallelize == "./model.py:parallelize"  # as written
    # A dumped and re-validated block sets every key: the defaults stay no conflict.
    again = ParallelismSpec.model_validate(ParallelismSpec().model_dump(), strict=True)
    assert again == ParallelismSpec()
    assert load_job(job_file(tmp_path, "parallelism:\n  pipeline_parallel_schedule: 1f1b\n"))


def test_asgd_is_distbelief_with_tensor_or_pipeline_parallelism(tmp_path: Path) -> None:
    job = load_job(job_file(tmp_path, ASGD + TP2))
    assert job.parallelism is not None and job.parallelism.tensor_parallel_degree == 2


# ------------------------------------------------------------------- layout(workers)


def test_layout_resolves_the_replicas() -> None:
    spec = ParallelismSpec(tensor_parallel_degree=2, pipeline_parallel_degree=2)
    assert spec.layout(8) == MeshLayout(pp=2, dp_replicate=2, tp=2)
    explicit = ParallelismSpec(tensor_parallel_degree=2, data_parallel_replicate_degree=2)
    assert explicit.layout(4) == MeshLayout(dp_replicate=2, tp=2)


@pytest.mark.parametrize(
    ("degrees", "workers", "key", "message"),
    [
        (
            {"tensor_parallel_degree": 2, "pipeline_parallel_degree": 2},
            6,
            "pipeline_parallel_degree",  # each divides 6; the last one tips the product
            "tensor_parallel_degree 2 × pipeline_parallel_degree 2 = 4 does not divide the "
            "number of workers (6); make workers a multiple of 4",
        ),
        (
            {"tensor_parallel_degree": 4, "data_parallel_shard_degree": 2},
            6,
            "tensor_parallel_degree",  # the first that does not divide 6
            "tensor_parallel_degree 4 × data_parallel_shard_degree 2 = 8 does not divide the "
            "number of workers (6); make workers a multiple of 8",
        ),
        (
            {"tensor_parallel_degree": 2, "data_parallel_replicate_degree": 2},
            8,
            "data_parallel_replicate_degree",
            "tensor_parallel_degree 2 × data_parallel_replicate_degree 2 = 4, but the degrees "
            "must multiply to the number of workers (8)",
        ),
    ],
)
def test_layout_names_the_degrees_the_workers_and_the_key_at_fault(
    degrees: dict[str, int], workers: int, key: str, message: str
) -> None:
    with pytest.raises(MeshMismatch) as info:
        ParallelismSpec.model_validate(degrees).layout(workers)
    assert (info.value.key, str(info.value)) == (key, message)
    assert isinstance(info.value, ValueError)


def test_layout_carries_the_pipeline_settings() -> None:
    spec = ParallelismSpec(
        pipeline_parallel_degree=2,
        pipeline_parallel_schedule="ZBVZeroBubble",
        pipeline_parallel_microbatches=6,
    )
    assert spec.layout(2) == MeshLayout(pp=2, schedule="ZBVZeroBubble", microbatches=6)
    assert ParallelismSpec().layout(3) == MeshLayout(dp_replicate=3, microbatches=0)


# --------------------------------------------------------------------------- the plan


def test_every_host_gets_the_resolved_mesh_and_the_parallelize_string(tmp_path: Path) -> None:
    job = load_job(job_file(tmp_path, "workers: 4\n" + TP2 + "parallelize: model.py:parallelize\n"))
    plan = plan_of(job, cluster(2, 2, 2))
    assert plan.mesh == MeshLayout(dp_replicate=2, tp=2)
    assert plan.parallelize == "model.py:parallelize"
    for host in (*plan.hosts, *plan.spares):
        assert loads(host.env[protocol.ENV_PARALLELISM]) == plan.mesh
        assert host.env[protocol.ENV_PARALLELIZE] == "model.py:parallelize"
        assert (
            plan.agent_config(host).env[protocol.ENV_PARALLELISM]
            == host.env[protocol.ENV_PARALLELISM]
        )
    plain = plan_of(load_job(job_file(tmp_path, "workers: 4\n")), cluster(2, 2))
    assert plain.mesh is None and plain.parallelize is None
    assert not {protocol.ENV_PARALLELISM, protocol.ENV_PARALLELIZE} & set(plain.hosts[0].env)


def test_the_mesh_without_parallelize_and_the_world_excludes_servers(tmp_path: Path) -> None:
    job = load_job(job_file(tmp_path, "workers: 4\n" + ASGD + TP2))
    plan = plan_of(job, cluster(2, 2))
    assert plan.world_size == 5 and plan.mesh == MeshLayout(dp_replicate=2, tp=2)
    assert protocol.ENV_PARALLELIZE not in plan.hosts[0].env
    assert loads(plan.hosts[1].env[protocol.ENV_PARALLELISM]).world == 4


def test_plan_json_round_trip_keeps_the_mesh(tmp_path: Path) -> None:
    text = (
        "workers: 4\nparallelism:\n  pipeline_parallel_degree: 2\n"
        "  pipeline_parallel_schedule: LoopedBFS\n  pipeline_parallel_microbatches: 4\n"
        "parallelize: model.py:parallelize\n"
    )
    plan = plan_of(load_job(job_file(tmp_path, text)), cluster(4))
    back = LaunchPlan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert back == plan
    assert back.mesh == MeshLayout(pp=2, dp_replicate=2, schedule="LoopedBFS", microbatches=4)
    assert layout_from(plan.to_dict()["mesh"]) == plan.mesh
    with pytest.raises(ValueError, match="not a mesh layout"):
        layout_from({"pp": 0})


def test_the_degrees_are_checked_at_plan_time_with_workers_auto(tmp_path: Path) -> None:
    file = job_file(tmp_path, "parallelism:\n  tensor_parallel_degree: 4\n")
    job = load_job(file)
    with pytest.raises(PlanError) as info:
        place_job(cluster(3, 3), job)  # auto: 6 workers
    error = info.value
    assert (error.spec, error.path) == ("job", ("parallelism", "tensor_parallel_degree"))
    assert error.message == (
        "tensor_parallel_degree 4 does not divide the number of workers (6); make workers a "
        "multiple of 4 (workers: auto: every slot of the cluster)"
    )
    assert str(locate(error, file, None)) == f"{file}:3 parallelism.tensor_parallel_degree: " + (
        error.message
    )
    assert place_job(cluster(2, 2), job).mesh == MeshLayout(tp=4)
    # --workers overrides 'workers': the same check, made once, in the plan, and the
    # message blames the flag, pointing at the degree it conflicts with
    with pytest.raises(
        PlanError, match=r"divide the number of workers \(6\); make workers a multiple of 4$"
    ) as flagged:
        place_job(cluster(4, 4), with_workers(job, 6))
    assert str(locate(flagged.value, file, None, ("workers",))) == (
        f"--workers: {flagged.value.message} (parallelism.tensor_parallel_degree at {file}:3)"
    )
    assert place_job(cluster(4, 4), with_workers(job, 8)).mesh == MeshLayout(dp_replicate=2, tp=4)


@pytest.mark.parametrize("key", ["min_hosts", "max_hosts"])
def test_min_and_max_hosts_are_refused_with_a_mesh(tmp_path: Path, key: str) -> None:
    job = load_job(job_file(tmp_path, f"workers: 4\n{key}: 2\n" + TP2))
    with pytest.raises(PlanError) as info:
        place_job(cluster(2, 2), job)
    assert info.value.path == (key,)
    assert info.value.message == (
        "min_hosts/max_hosts (continuing on fewer hosts) is not supported with parallelism (a "
        "re-plan on fewer hosts would break the device mesh); remove them (a lost host then "
        "fails the run)"
    )


def test_a_replan_keeps_the_mesh_or_refuses_another_number_of_workers(tmp_path: Path) -> None:
    job = load_job(job_file(tmp_path, "workers: 4\n" + TP2 + "parallelize: model.py:parallelize\n"))
    plan = plan_of(job, cluster(2, 2, 2, 1))
    new = replan(plan, {"b", "c", "d"}, "10.0.0.2:4000")
    assert (new.mesh, new.parallelize) == (plan.mesh, plan.parallelize)
    assert all(protocol.ENV_PARALLELISM in h.env for h in new.hosts)
    with pytest.raises(
        CannotReplan, match="the device mesh needs 4 workers; the available hosts run 3"
    ):
        replan(plan, {"b", "d"}, "10.0.0.2:4000")


# ----------------------------------------------------------------------------- dry run


def mesh_block(text: str) -> list[str]:
    """The dry run's lines between the rendezvous line and the first host."""
    lines = text.splitlines()
    return lines[2 : lines.index("")]


def test_dry_run_shows_a_tp_by_dp_mesh(tmp_path: Path) -> None:
    job = load_job(job_file(tmp_path, "workers: 4\n" + TP2 + "parallelize: model.py:parallelize\n"))
    assert mesh_block(render_plan(plan_of(job, cluster(4)))) == [
        "device mesh: dp_replicate 2 × tp 2 (4 workers)",
        "  dp_replicate groups: [0, 2]  [1, 3]",
        "  tp groups: [0, 1]  [2, 3]",
        "parallelize: model.py:parallelize",
    ]


def test_dry_run_groups_name_global_ranks_around_a_parameter_server(tmp_path: Path) -> None:
    job = load_job(job_file(tmp_path, "workers: 4\n" + ASGD + TP2))
    plan = plan_of(job, cluster(2, 2))
    assert [(r.rank, r.role) for r in plan.ranks] == [
        (0, "worker"),
        (1, "worker"),
        (2, "server"),
        (3, "worker"),
        (4, "worker"),
    ]
    assert mesh_block(render_plan(plan)) == [
        "device mesh: dp_replicate 2 × tp 2 (4 workers)",
        "  dp_replicate groups: [0, 3]  [1, 4]",
        "  tp groups: [0, 1]  [3, 4]",
    ]


def test_describe_over_maps_mesh_workers_to_global_ranks() -> None:
    layout = MeshLayout(pp=2, tp=2, schedule="Interleaved1F1B", microbatches=4)
    assert describe_over(layout, range(4)) == layout.describe()
    lines = describe_over(layout, [0, 1, 3, 4])
    assert lines[0] == layout.describe()[0] and lines[-1] == layout.describe()[-1]
    assert lines[1:3] == ["  pp groups: [0, 3]  [1, 4]", "  tp groups: [0, 1]  [3, 4]"]
    with pytest.raises(ValueError, match="3 ranks for a mesh of 4 workers"):
        describe_over(layout, [0, 1, 2])
    assert worker_ranks([(4, "worker"), (2, "server"), (0, "worker")]) == [0, 4]


def test_cli_refuses_a_bad_block_with_one_line_and_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DMLCTL_HOME", str(tmp_path / "home"))
    file = job_file(tmp_path, "workers: 2\nparallelism:\n  tensor_parallel_degree: 0\n")
    assert main(["launch", file, "--dry-run"]) == 2
    out, err = capsys.readouterr()
    assert err == f"dmlctl: {file}:4 parallelism.tensor_parallel_degree: must be >= 1, got 0\n"
    assert "Traceback" not in out
    Path(file).write_text(
        "script: train.py\nworkers: 2\nparallelism:\n  tensor_parallel_degree: 4\n"
    )
    assert main(["launch", file, "--dry-run"]) == 2
    err = capsys.readouterr().err  # after a warning when 2 workers oversubscribe the cores
    assert err.splitlines()[-1] == (
        f"dmlctl: {file}:4 parallelism.tensor_parallel_degree: tensor_parallel_degree 4 "
        "does not divide the number of workers (2); make workers a multiple of 4"
    )
    assert not (tmp_path / "home" / "runs").exists()


def test_state_json_keeps_the_mesh() -> None:
    from dmlctl.runs.state import RunState, new_run_state

    state = new_run_state("r", "j", "ssgd", [(0, "a", "worker")], 1.0, MeshLayout(tp=1))
    assert RunState.from_dict(json.loads(json.dumps(state.to_dict()))) == state
    assert dataclasses.replace(state, mesh=None).to_dict()["mesh"] is None


# ------------------------------------------------------------- dashboard and status


def _render(renderable: object, width: int) -> str:
    import io

    from rich.console import Console

    console = Console(record=True, width=width, color_system=None, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


@pytest.mark.parametrize("width", [80, 160])
def test_the_rank_table_shows_each_workers_place_in_the_mesh(width: int) -> None:
    from dmlctl.runs.events import MetricRecord
    from dmlctl.runs.reducer import apply
    from dmlctl.runs.state import new_run_state
    from dmlctl.ui import render_dashboard, render_run_detail

    roles = ["worker", "worker", "server", "worker", "worker"]  # asgd, a server on host a
    ranks = [(i, "ab"[i // 3], role) for i, role in enumerate(roles)]
    state = new_run_state("r-1", "job", "asgd", ranks, 0.0, MeshLayout(dp_replicate=2, tp=2))
    state = apply(state, [MetricRecord(h, r, 7, {"loss": 0.5}, 1.0) for r, h, _ in ranks])
    for view in (render_dashboard(state, 9.0), render_run_detail(state, 9.0)):
        lines = _render(view, width).splitlines()
        assert all(len(line) <= width for line in lines)
        at = next(i for i, line in enumerate(lines) if "mesh" in line.split())
        column = lines[at].index("mesh")
        cells = [line[column:].split("  ")[0] for line in lines[at + 1 : at + 6]]
        assert cells == ["dp0 tp0", "dp0 tp1", "-", "dp1 tp0", "dp1 tp1"]
    detail = _render(render_run_detail(state, 9.0), width).splitlines()
    assert "device mesh: dp_replicate 2 × tp 2 (4 workers)" in detail
    plain = dataclasses.replace(state, mesh=None)
    assert "mesh" not in _render(render_run_detail(plain, 9.0), width)

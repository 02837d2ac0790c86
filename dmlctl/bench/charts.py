"""The picture of each benchmark's report, for ``dmlctl bench … --plot FILE``.

Each chart takes the report in the shape ``--json`` prints (so a saved report draws
the same) and returns a title and the panels :func:`dmlctl.ui.plot.draw` renders:
measurements as points (every repeat, the median marked), sweeps as lines, per-name
figures as bars, goals and baselines as dashed lines. Pure and torch-free;
matplotlib is imported only by :func:`write`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dmlctl.bench.advise_spec import parse_target
from dmlctl.bench.parallel_report import GOAL_LABELS
from dmlctl.ui.plot import Bars, Lines, Panel, Samples, draw

Chart = tuple[str, list[Panel]]
Report = Mapping[str, Any]


def comm(report: Report) -> Chart:
    """Bus bandwidth against message size, one line per collective."""
    lines: dict[str, list[tuple[float, float]]] = {}
    for r in report["results"]:
        lines.setdefault(r["op"], []).append((float(r["bytes"]), float(r["busbw_gbps"])))
    panel = Lines("message bytes", "bus bandwidth (GB/s)", lines, log_x=True)
    return f"collectives, {report['world_size']} ranks", [panel]


def ps(report: Report) -> Chart:
    """Push+pull and all-reduce bytes/s against gradient size, and their ratio with
    the goal."""
    rows = report["results"]
    rates = {
        "push+pull (parameter servers)": [(r["bytes"], r["ps_bytes_per_s"] / 1e6) for r in rows],
        "all-reduce": [(r["bytes"], r["allreduce_bytes_per_s"] / 1e6) for r in rows],
    }
    ratio = {"push+pull / all-reduce": [(r["bytes"], r["ratio"]) for r in rows]}
    return (
        f"parameter servers, {report['workers']} workers + {report['servers']} servers",
        [
            Lines("gradient bytes", "MB/s", rates, log_x=True),
            Lines("gradient bytes", "ratio", ratio, log_x=True, refs={"goal": report["goal"]}),
        ],
    )


def launch(report: Report) -> Chart:
    """Seconds per launch, every repeat, for dmlctl and bare torchrun."""
    groups = {
        "dmlctl launch": report["dmlctl_s"]["samples"],
        "torchrun": report["torchrun_s"]["samples"],
    }
    title = f"launch to exit, {report['workers']} workers: ratio {report['ratio']:.2f}"
    return title, [Samples("seconds", groups)]


def strategies(report: Report) -> Chart:
    """The sections the report holds: ssgd's throughput through dmlctl against
    hand-written DDP, each strategy's and filter's bytes per step relative to its
    baseline, and samples/s with overlap off and on."""
    panels: list[Panel] = []
    title = f"strategies, {report['workers']} workers"
    if "throughput_ratio" in report:
        groups = {
            "dmlctl ssgd": report["dmlctl_samples_per_s"]["samples"],
            "hand-written DDP": report["bare_samples_per_s"]["samples"],
        }
        panels.append(Samples("samples/s", groups))
        title += f": throughput ratio {report['throughput_ratio']:.3f}"
    rows = {**report.get("bytes", {}), **report.get("filters", {})}
    measured = {n: row for n, row in rows.items() if "ratio" in row}
    if measured:
        ratios = {"bytes per step": [row["ratio"] for row in measured.values()]}
        panels.append(Bars("bytes per step / baseline's", list(measured), ratios))
    if "overlap" in report:
        names = list(report["overlap"])
        rates = {
            f"overlap {side}": [
                report["overlap"][n][side]["samples_per_s"]["median"] for n in names
            ]
            for side in ("false", "true")
        }
        panels.append(Bars("samples/s per worker", names, rates))
    return title, panels


def accuracy(report: Report) -> Chart:
    """The task's metric (test accuracy or validation loss) per strategy and optimizer;
    the single process dashed."""
    names = [row["name"] for row in report["rows"]]
    labels = report["labels"]
    bars = {labels[o]: [row["value"][o] for row in report["rows"]] for o in report["optimizers"]}
    refs = {f"single process, {labels[o]}": v for o, v in report["baseline"].items()}
    title = f"{report['metric']} on {report['data']}, {report['epochs']} epochs"
    return title, [Bars(report["metric"], names, bars, refs, zoom=True)]


def recovery(report: Report) -> Chart:
    """Seconds from the kill to the first step after restart, every repeat, and the
    median time each stage of the recovery was reached."""
    sides = [s for s in ("dmlctl", "torchrun") if s in report]
    groups = {s: report[s]["recovery_s"]["samples"] for s in sides}
    stages = list(dict.fromkeys(k for s in sides for k in report[s]["stages_s"]))
    bars = {s: [report[s]["stages_s"].get(k, 0.0) for k in stages] for s in sides}
    return (
        f"recovery after a killed worker: ratio {report['ratio']:.2f}",
        [
            Samples("seconds to the first step", groups),
            Bars("seconds after the kill (median)", stages, bars),
        ],
    )


def straggler(report: Report) -> Chart:
    """Per scenario: the fast workers' steps/s with a 3× straggler relative to none
    (the goal dashed), and the straggler's own pace."""
    rows = report["scenarios"]
    bars = {
        "fast workers": [r["ratio"] for r in rows],
        "straggler": [r["straggler_pace"] for r in rows],
    }
    names = [r["name"] for r in rows]
    refs = {"goal (absorbing strategies)": report["goal"], "no straggler": 1.0}
    title = f"a {report['factor']:g}× slower worker, {report['steps']} steps"
    return title, [Bars("steps/s relative to no straggler", names, bars, refs)]


def sparse(report: Report) -> Chart:
    """Samples/s of every run per strategy, and the final training loss."""
    rows = report["strategies"]
    groups = {name: row["samples_per_s"]["samples"] for name, row in rows.items()}
    loss = Bars(
        "final training loss",
        list(rows),
        {"loss": [r["train_loss"]["median"] for r in rows.values()]},
    )
    ratio = report["ratio"]
    title = f"sparse logistic regression, {report['workers']} workers"
    if ratio is not None:
        title += f": cyclades / hogwild {ratio:.2f}"
    return title, [Samples("samples/s", groups), loss]


def logs(report: Report) -> Chart:
    """The printing loop's seconds against the silent one's, every repeat, and the
    lines per second carried to the run directory against the goal."""
    loop, flood = report["loop"], report["carried"]
    groups = {"printing": loop["stdout_s"], "silent (/dev/null)": loop["devnull_s"]}
    carried = Bars(
        "lines/s carried",
        ["2 ranks printing"],
        {"carried": [flood["lines_per_s"]]},
        {"goal": report["goal_lines_per_s"]},
    )
    return f"logs: slowdown {loop['slowdown']:+.1%}", [Samples("loop seconds", groups), carried]


def hangs(report: Report) -> Chart:
    """Per scenario: hang verdicts and culprits named per run, and each real hang's
    delay from its start to the verdict against the goal."""
    rows = report["scenarios"]
    names = [r["scenario"] for r in rows]
    shares = {
        "hang verdicts / runs": [r["hung"] / max(r["runs"], 1) for r in rows],
        "culprit named / runs": [r["named"] / max(r["runs"], 1) for r in rows],
    }
    delays = {r["scenario"]: r["delays_s"] for r in rows if r["delays_s"]}
    panels: list[Panel] = [Bars("share of runs (healthy scenarios: false ones)", names, shares)]
    if delays:
        panels.append(Samples("seconds to the verdict", delays, {"goal": report["goal_delay_s"]}))
    return f"hang detector, hang_timeout {report['hang_timeout']:g} s", panels


def advise(report: Report) -> Chart:
    """Per scenario, the target metric against seconds since launch and against bytes
    sent, one line per candidate, the target dashed."""
    metric, target = report["metric"], {"target": parse_target(report["target"]).value}
    labels = dict.fromkeys(c["label"] for s in report["scenarios"] for c in s["candidates"])
    colors = {label: f"C{i % 10}" for i, label in enumerate(labels)}
    panels: list[Panel] = []
    for scenario in report["scenarios"]:
        drawn = [c for c in scenario["candidates"] if c["curve"]]
        by_time = {c["label"]: [(p[0], p[2]) for p in c["curve"]] for c in drawn}
        by_bytes = {c["label"]: [(p[1] / 1e6, p[2]) for p in c["curve"]] for c in drawn}
        name = scenario["name"]
        axes = (f"seconds since launch ({name})", f"MB sent by all ranks ({name})")
        panels.append(Lines(axes[0], metric, by_time, refs=target, colors=colors))
        panels.append(Lines(axes[1], metric, by_bytes, refs=target, colors=colors))
    return f"time and traffic to {report['target']}", panels


def parallel(report: Report) -> Chart:
    """Per layout: the largest rank's parameters + optimizer state relative to the
    whole model's, and its share of the tensor-plan layers, the goals dashed; and the
    whole run's samples/s of every run, the baseline's median dashed."""
    rows = report["layouts"]
    names = list(rows)
    shares = {
        "params + optimizer / whole model's": [r["memory_ratio"] for r in rows.values()],
        "tensor-plan layers / theirs": [r["sharded_ratio"] for r in rows.values()],
    }
    goals = {
        f"goal {name}: {GOAL_LABELS.get(measure, measure)} ≤ {goal['bound']:g}": goal["bound"]
        for name, row in rows.items()
        for measure, goal in row["goals"].items()
    }
    rates = {name: row["samples_per_s"]["samples"] for name, row in rows.items()}
    base = rows.get(report["baseline"])
    refs = {f"{report['baseline']} median": base["samples_per_s"]["median"]} if base else {}
    return (
        f"model parallelism, {report['workers']} workers, global batch {report['global_batch']}",
        [
            Bars("share of the whole model (largest rank)", names, shares, goals),
            Samples("samples/s, whole run", rates, refs),
        ],
    )


CHARTS: dict[str, Callable[[Report], Chart]] = {
    "advise": advise,
    "comm": comm,
    "ps": ps,
    "launch": launch,
    "strategies": strategies,
    "accuracy": accuracy,
    "recovery": recovery,
    "straggler": straggler,
    "sparse": sparse,
    "logs": logs,
    "hangs": hangs,
    "parallel": parallel,
}
"""Every ``dmlctl bench`` command's chart, by command name."""


def write(bench: str, report: Report, out: Path) -> None:
    """Draw ``bench``'s chart of ``report`` (its ``--json`` shape) into ``out`` (PNG)."""
    title, panels = CHARTS[bench](report)
    draw(out, title, panels)

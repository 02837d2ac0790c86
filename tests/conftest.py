"""Shared fixtures: an isolated DMLCTL_HOME and a way to run the real CLI."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests import hung
from tests.integration import procs

REPO = Path(__file__).resolve().parent.parent


RANKS = "warm"
"""How the ranks of the suite's launches start, unless a test names ``--ranks`` itself:
warm, which saves every rank its own import of torch (the suite's time). The tests of
the default, fresh ranks launch with ``--ranks fresh``."""


def _with_ranks(args: tuple[str, ...]) -> tuple[str, ...]:
    """``args`` of a ``dmlctl launch JOB`` with :data:`RANKS`, unless they say otherwise."""
    if not args or args[0] != "launch" or "--ranks" in args or "--resume" in args:
        return args
    return (*args, "--ranks", RANKS)


@dataclass
class Cli:
    """Runs ``python -m dmlctl`` as a user would, with its own DMLCTL_HOME (a launch
    with :data:`RANKS`, unless it names ``--ranks``)."""

    home: Path
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        # An agent server a test starts leaves a minute after the suite's last launch.
        base = {"DMLCTL_HOME": str(self.home), "COLUMNS": "160", "DMLCTL_AGENT_SERVER_IDLE": "60"}
        return {**os.environ, **base, **self.extra_env}

    def run(
        self, *args: str, cwd: Path | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """The command's outcome; one still running after ``timeout`` seconds fails
        the test with what it printed and what its runs' processes were doing
        (:func:`tests.hung.describe`), then is killed."""
        proc = subprocess.Popen(
            [sys.executable, "-m", "dmlctl", *_with_ranks(args)],
            cwd=cwd,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            what = hung.describe(self.home)
            proc.kill()
            out, err = proc.communicate()
        else:
            return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        pytest.fail(
            f"dmlctl {' '.join(args)} still ran after {timeout:g} s\n"
            f"--- stdout\n{out}--- stderr\n{err}{what}",
            pytrace=False,
        )

    def popen(self, *args: str, cwd: Path | None = None) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "dmlctl", *_with_ranks(args)],
            cwd=cwd,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def runs(self) -> list[Path]:
        root = self.home / "runs"
        if not root.is_dir():
            return []
        return sorted(p for p in root.iterdir() if (p / "state.json").is_file())

    def state(self, run_id: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.home / "runs" / run_id / "state.json").read_text())
        return data


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Cli]:
    home = tmp_path / "home"
    yield Cli(home)


# ---------------------------------------------------------------- running side by side

#: Directories whose tests share one set of outside resources (fixed loopback addresses
#: and sshd servers, named network namespaces): each runs in one pytest-xdist worker.
_ONE_WORKER_DIRS = ("ssh", "lab")


def xdist_group_of(item: pytest.Item) -> str:
    """The group ``item`` runs in under ``pytest -n N --dist loadgroup``: its directory
    for :data:`_ONE_WORKER_DIRS`, else its file (so module- and session-scoped fixtures
    such as shared finished runs, the accuracy baseline and a module's lab are made once,
    and a file's tests run in their written order)."""
    if not item.path.is_relative_to(REPO / "tests"):  # a test file a test made
        return item.path.as_posix()
    rel = item.path.relative_to(REPO / "tests")
    if rel.parts[0] in _ONE_WORKER_DIRS:
        return rel.parts[0]
    return _SAME_GROUP_AS.get(rel.as_posix(), rel.as_posix())


#: Files that run in another file's group, to share its session fixtures (made once per
#: xdist worker): DistBelief compares against the accuracy table's single-process baseline.
_SAME_GROUP_AS = {"strategies/test_distbelief.py": "strategies/test_accuracy.py"}


#: The longest groups, longest first (`make test`'s durations): xdist hands groups out in
#: collection order (with --no-loadscope-reorder), so these start first and the short
#: ones fill the workers around them, instead of one long group running alone at the end.
_LONGEST_GROUPS = (
    "lab",
    "ssh",
    "integration/test_launch.py",
    "strategies/test_accuracy.py",
    "strategies/test_lm_quality.py",
    "integration/test_parameter_servers.py",
    "integration/test_checkpoint_faults.py",
    "integration/test_bench_advise.py",
    "integration/test_bench_parallel.py",
    "integration/test_parallel_launch.py",
    "integration/test_bench_recovery.py",
)
#: Then the rest of these directories (real processes), then everything else.
_PROCESS_DIRS = ("integration", "lab", "strategies")


def _group_order(group: str) -> int:
    if group in _LONGEST_GROUPS:
        return _LONGEST_GROUPS.index(group)
    return len(_LONGEST_GROUPS) + (0 if group.split("/")[0] in _PROCESS_DIRS else 1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest groups first (see :data:`_LONGEST_GROUPS`); a group's tests keep their
    written order."""
    items.sort(key=lambda item: _group_order(xdist_group_of(item)))


def pytest_itemcollected(item: pytest.Item) -> None:
    """Give every test its xdist group (see :func:`xdist_group_of`) as it is collected,
    before xdist reads the groups; a test that names one itself keeps it."""
    if item.get_closest_marker("xdist_group") is None:
        item.add_marker(pytest.mark.xdist_group(xdist_group_of(item)))


#: How much lower a worker's priority is while it runs the groups that compute (every
#: group but :data:`_ONE_WORKER_DIRS`) than while it runs the groups that mostly wait on
#: time (SSH hosts, lab namespaces, Slurm): a host's silence, a node's death, a requeue.
#: Those take the cores when they need them and the computing groups use what they leave,
#: so a third worker fills their waiting without stretching it.
COMPUTING_NICE = 10


def pytest_runtest_setup(item: pytest.Item) -> None:
    """In an xdist worker, lower the worker's priority (once, for good) when it starts a
    computing group; the processes it starts from then on inherit it. xdist hands out
    the waiting groups first (:data:`_LONGEST_GROUPS`), so no worker goes back to one."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return
    if xdist_group_of(item) in _ONE_WORKER_DIRS or os.getpriority(os.PRIO_PROCESS, 0) > 0:
        return
    os.setpriority(os.PRIO_PROCESS, 0, COMPUTING_NICE)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The warm rank pools end with the session (an xdist worker skips ``atexit``); in
    the controller, so does every process the session's tests left behind, also when
    it was interrupted (Ctrl-C): sshd servers, agent servers, anything started under
    the session's temporary directory (:func:`tests.integration.procs.leftovers`)."""
    pool = sys.modules.get("tests.strategies.pool")
    if pool is not None:
        pool.close_pools()
    if "PYTEST_XDIST_WORKER" not in os.environ:
        factory = getattr(session.config, "_tmp_path_factory", None)
        if factory is not None:
            for pid in procs.leftovers(str(factory.getbasetemp())):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)

"""Recording a run and running its controller (:func:`start_run`): the run directory
with the specs as validated (env values redacted), the plan and a first state, then
the controller here until the run ends, or detached (:func:`detach`)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from dmlctl import checkpoint_claim, protocol
from dmlctl.launch.options import LaunchOptions, LaunchResult
from dmlctl.plan.model import LaunchPlan
from dmlctl.redact import Redactor, redact_args
from dmlctl.run_key import new_key
from dmlctl.runs import secrets as run_secrets
from dmlctl.runs.files import StoreError, private_opener, private_umask
from dmlctl.runs.state import new_run_state
from dmlctl.runs.store import RunDir, RunStore
from dmlctl.spec.models import ClusterSpec, JobSpec
from dmlctl.transport import Transport, close_transports
from dmlctl.ui.sinks import make_sink


def _spec_copy(model: JobSpec | ClusterSpec, source: Path | None, redactor: Redactor) -> str:
    """The YAML kept in ``specs/``: the spec as validated, every env value redacted,
    each secret-holding argument in its redacted form, and any known secret hidden
    wherever else it stands (``args``, ``setup``)."""
    data = model.model_dump(mode="json", exclude_defaults=True)
    for env in _envs_of(data):
        env.update(run_secrets.redacted_env(env))
    if "args" in data:  # a token or URL password in an argument, as the plan shows it
        data["args"] = redact_args(data["args"])
    head = f"# {source} as validated by dmlctl; env values redacted\n" if source else ""
    shown = yaml.safe_dump(redactor.data(data), sort_keys=False, allow_unicode=True)
    return redactor.text(head) + shown


def _envs_of(data: dict[str, Any]) -> list[dict[str, str]]:
    """The ``env`` mappings of a dumped job or cluster spec."""
    holders = [data, data.get("defaults") or {}, *(data.get("hosts") or [])]
    return [h["env"] for h in holders if isinstance(h.get("env"), dict)]


def claim_checkpoints(plan: LaunchPlan) -> list[int]:
    """Claim the checkpoint directory the job names (``checkpoint.dir``) on every host
    of the plan on this machine for the run (:mod:`dmlctl.checkpoint_claim`): the lock
    descriptors, to keep open for the run's life.
    :class:`~dmlctl.checkpoint_claim.CheckpointInUse` (exit 2) when another run holds
    one; nothing stays claimed then."""
    held: list[int] = []
    dirs = {  # not the default directory: the run's own (in its rank directories)
        checkpoint_claim.where(h.env[protocol.ENV_CHECKPOINT_DIR], h.workdir)
        for h in plan.hosts + plan.spares
        if h.is_local and h.env.get(protocol.ENV_CHECKPOINT_CLAIM) == "1"
    }
    try:
        for directory in sorted(dirs):
            fd = checkpoint_claim.claim(directory, plan.run_id)
            if fd is not None:
                held.append(fd)
    except BaseException:
        checkpoint_claim.release(*held)
        raise
    return held


def create_run(
    plan: LaunchPlan, job: JobSpec, cluster: ClusterSpec, store: RunStore, options: LaunchOptions
) -> RunDir:
    """Make the run directory with specs, plan (env values redacted; the values in
    ``secrets.json``) and an initial state. A failure (a full disk) removes what was
    made and raises :class:`~dmlctl.runs.files.StoreError`."""
    run = store.create(plan.run_id)
    hosts = cluster.resolved_hosts()
    redactor = Redactor.for_envs([job.env, *(h.env for h in hosts)], plan.secrets)
    try:
        run.write_text(run.specs / "job.yaml", _spec_copy(job, options.job_file, redactor))
        run.write_text(
            run.specs / "cluster.yaml", _spec_copy(cluster, options.cluster_file, redactor)
        )
        keys = {h.name: {*job.env, *h.env} for h in hosts}
        run.write_plan(plan.to_dict(), keys, redactor.text, job.setup)
        run.write_state(
            new_run_state(
                plan.run_id,
                plan.job_name,
                plan.strategy,
                [(r.rank, r.host, r.role) for r in plan.ranks],
                time.time(),
                plan.mesh,
            )
        )
    except StoreError:
        shutil.rmtree(run.path, ignore_errors=True)
        raise
    return run


def detach(run: RunDir, *, resume: bool = False, claims: Sequence[int] = ()) -> int:
    """Start the run's controller as a process of its own (a new session); it inherits
    ``claims`` (the checkpoint claims, held as long as it lives)."""
    with open(run.controller_log, "ab", opener=private_opener) as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dmlctl.launch.controller",
                str(run.path),
                *(["--resume"] if resume else []),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            pass_fds=tuple(claims),
        )
    run.write_pid(proc.pid)
    return proc.pid


def start_run(
    plan: LaunchPlan,
    transports: dict[str, Transport],
    job: JobSpec,
    cluster: ClusterSpec,
    store: RunStore,
    options: LaunchOptions,
    console: Console,
) -> LaunchResult:
    """Record the run and run its controller: here (until the run ends) or detached."""
    from dmlctl.launch.controller import run_controller

    plan = dataclasses.replace(plan, key=new_key())  # the run's own (dmlctl.run_key)
    with private_umask():  # every file of the run is the user's alone
        try:
            claims = claim_checkpoints(plan)
            run = create_run(plan, job, cluster, store, options)
        except (StoreError, checkpoint_claim.CheckpointInUse):
            close_transports(transports)
            raise
        try:
            if options.detach:
                close_transports(transports)
                pid = detach(run, claims=claims)
                return LaunchResult(plan.run_id, run.path, None, 0 if pid else 1)
            run.write_pid(os.getpid())
            sink = make_sink(options.ui, console, str(run.path))
            state = run_controller(run, plan, sink, transports)
        finally:
            checkpoint_claim.release(*claims)
    return LaunchResult(plan.run_id, run.path, state, int(state.exit_code or 0))

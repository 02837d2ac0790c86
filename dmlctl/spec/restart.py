"""The ``restart:`` and ``checkpoint:`` blocks of a job file (pure models, no I/O).

``RestartSpec`` is the one definition of the restart settings, their defaults and
bounds: validated once when the job file is read, carried typed in the plan
(``LaunchPlan.restart``) and read as it is by the restart policy
(:func:`dmlctl.launch.policy.step`, :func:`~dmlctl.launch.policy.budget`,
:func:`~dmlctl.launch.policy.backoff`) and the supervisor.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from dmlctl.spec.fields import (
    FROZEN,
    MAX_KEEP,
    MAX_RESTARTS,
    MAX_STEPS,
    PlaceholderPath,
    Seconds,
    SecondsOrZero,
)

__all__ = ["CheckpointSpec", "RestartSpec", "check_in_place"]

Restarts = Annotated[int, Field(ge=0, le=MAX_RESTARTS)]
"""A restart budget: 0 (never restart) to :data:`~dmlctl.spec.fields.MAX_RESTARTS`."""


class RestartSpec(BaseModel):
    """When a failed run is started again, and how long dmlctl waits before each restart.

    Failures are split in two kinds with separate budgets: *user* failures (a rank
    raised an exception or exited non-zero) and *infra* failures (a rank killed by a
    signal, a host agent lost, torchrun failing, a hang). Restart ``n`` (0-based) waits
    ``min(backoff_initial * backoff_factor ** n, backoff_max)`` seconds.
    """

    model_config = FROZEN

    mode: Literal["full", "in_place"] = "full"
    """What a lost rank restarts: 'full' (every rank, from the newest checkpoint), or 'in_place' (a
    worker killed by a signal is started again alone, from a live peer's or the servers' model,
    while the others go on; the parameter-server strategies, ssgd, local-sgd, bmuf, easgd, admm
    and dpsgd, without a parallelism: block; a killed parameter server too, from its newest
    snapshot; a lost host's ranks start on a spare host, or on the same host when only its agent
    died). Each replacement spends one of max_infra_restarts."""
    ps_snapshot_every: int = Field(default=500, ge=1)
    """With mode: in_place, a parameter server writes its state to its host's run directory (and,
    with a spare host, the run's store) every this many pushes and as it starts; its replacement
    starts from the newest one, and the pushes since are lost (counted as pushes_lost)."""
    max_user_restarts: Restarts = 0
    """Restarts allowed after failures of the training code itself (an exception or a non-zero
    exit); 0 = never restart those."""
    max_infra_restarts: Restarts = 3
    """Restarts allowed after infrastructure failures (a rank killed by a signal, a lost host, a
    torchrun failure, a hang)."""
    backoff_initial: Seconds = 1.0
    """Seconds to wait before the first restart."""
    backoff_factor: float = Field(default=2.0, ge=1, le=100, allow_inf_nan=False)
    """Multiplier applied to the wait after each restart (1 = constant wait)."""
    backoff_max: Seconds = 30.0
    """Longest wait before a restart, in seconds."""
    hang_timeout: Seconds = 30.0
    """Seconds a rank may go without a heartbeat, or with its training steps stalled and idle while
    others wait for it in a collective, before it counts as hung (an infra failure); stretched to
    4x its slowest recent step."""
    start_timeout: Seconds | None = None
    """Seconds a rank may take from its attempt's start to its first heartbeat before it counts as
    hung (named, with its stacks; an infra failure). Default: 120 plus 1 per rank of the world."""
    stop_grace: SecondsOrZero = 30.0
    """On a stop (Ctrl-C, dmlctl stop): seconds the ranks get after SIGTERM to save and exit before
    they are killed. After a failure, the ranks still running get this too, at most 5 s."""
    host_timeout: Seconds = 10.0
    """Seconds without any message from a host before it counts as lost (an infra failure); its
    agents send one every second."""
    host_wait: SecondsOrZero = 60.0
    """On a restart with fewer than min_hosts hosts answering: seconds to wait for lost hosts to
    answer again before the run fails."""
    standby: bool = True
    """Keep a warm host agent (torchrun already imported) on every host while the run goes on, so a
    restart skips torchrun's start-up (about 1 s); it costs one idle Python process with torch
    loaded per host."""
    rejoin_wait: SecondsOrZero = 30.0
    """With mode: in_place: seconds the other workers (and the parameter servers) wait for a lost
    host's workers when none can start elsewhere (no spare host, the host not answering) before
    they go on without them, while min_hosts allows; 0: they never go on without them (the run
    restarts)."""
    host_cooldown: SecondsOrZero = 30.0
    """Seconds a lost host is set aside before a restart may use it again (once it answers)."""


class CheckpointSpec(BaseModel):
    """How often the training script should save a checkpoint, and how many to keep.

    Leaving both ``every_steps`` and ``every_seconds`` unset disables periodic
    checkpoints; when both are set, whichever comes first triggers one. Every number
    is bounded: durations by one week, ``keep`` by 1000.
    """

    model_config = FROZEN

    every_steps: int | None = Field(default=None, ge=1, le=MAX_STEPS)
    """Save a checkpoint every this many training steps."""
    every_seconds: Seconds | None = None
    """Save a checkpoint every this many seconds of training."""
    keep: int = Field(default=3, ge=1, le=MAX_KEEP)
    """Number of most recent checkpoints kept; older ones are deleted."""
    dir: PlaceholderPath | None = None
    """Checkpoint directory on every host, e.g. on a shared filesystem (``{run_id}`` is replaced by
    the run id; any other ``{`` or ``}`` is refused). Default: a directory of the run on each
    host, copied to the controller's machine after every checkpoint and handed back to the hosts
    on a restart."""
    allow_fresh_start: bool = False
    """When checkpoints exist but none of them can be loaded (all corrupt): start from step 0
    instead of failing the run with CheckpointCorrupt."""
    warm_start: bool = False
    """Let a new run start from the newest checkpoint another run left in checkpoint.dir (its model,
    optimizer and step). Without it, such a checkpoint fails the run with CheckpointForeign
    before training: a run only ever resumes its own checkpoints (launch --resume continues a run
    under its own id)."""


def check_in_place(strategy: str, params: Any = None) -> None:
    """Refuse ``restart.mode: in_place`` for a strategy that cannot replace a lost
    worker while the others go on, or not with ``params`` (its validated params): a
    validation error at ``restart.mode``."""
    from pydantic import ValidationError
    from pydantic_core import InitErrorDetails, PydanticCustomError

    from dmlctl.strategies import registry

    caps = registry.capabilities(strategy)
    if caps.in_place:
        why = caps.in_place_rule(params) if caps.in_place_rule and params is not None else None
        if why is None:
            return
        message = f"in_place does not apply to strategy {strategy!r} {why}; use full"
    else:
        able = [n for n in registry.names() if registry.capabilities(n).in_place]
        message = (
            f"in_place does not apply to strategy {strategy!r}: its workers meet in "
            f"collectives a replacement cannot join (in place: {', '.join(able)}); use full"
        )
    error = InitErrorDetails(
        type=PydanticCustomError("in_place", message), loc=("mode",), input="in_place"
    )
    raise ValidationError.from_exception_data("restart", [error])

"""``python -m dmlctl.agent.served --run-id RUN``: a host agent on a remote host, from
that host's agent server where one matches.

The SSH transport starts agents with this command (:func:`dmlctl.transport.agent_server
.served`). It asks the host's server (:mod:`dmlctl.agent.ask`) to fork
``python -m dmlctl.agent --run-id RUN`` on this process's own stdin, stdout and stderr
— the SSH channel's, so the agent reads its configuration from the controller and
writes its messages to it directly, and sees the channel close as any agent does —
then waits for the agent's end and ends the same way (its exit code, or the signal
that killed it). SIGTERM, SIGHUP and SIGINT sent to this process go to the agent,
and an end of this process (a ``kill -9``) stops the agent as a closed channel does.
The agent skips importing torch (seconds of a core): the host's server made that
import once, for every agent it forks.

Where none listens yet, it starts one and waits for it (the server's import of torch
serves this agent too), sending the controller the keepalive an agent would
meanwhile; where none can serve (it failed to start, another interpreter,
``DMLCTL_AGENT_SERVER_IDLE=0``) it becomes the agent itself (``exec``), exactly as
``python -m dmlctl.agent`` would be.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from types import FrameType

from dmlctl.agent import ask

POLL_S = 0.1
"""How often the end of an agent whose server went away is looked for."""
ALIVE_S = 1.0
"""How often a starter waiting for its host's server tells the controller it lives (as
the agent does: the controller counts a silent host as lost)."""


def main(args: Sequence[str]) -> int:
    """Run the agent for ``args`` (module docstring); its exit code."""
    agent = [sys.executable, *ask.AGENT, *args]
    env = dict(os.environ)
    try:
        conn = ask.connect(agent, env, _keepalive())
    except (OSError, ValueError):  # a file gone while keyed, say: as if no server
        conn = None
    if conn is None:
        os.execv(sys.executable, agent)
    try:
        pid = ask.request(conn, agent, os.getcwd(), env, (0, 1, 2), starter=os.getpid())
    except OSError:
        conn.close()
        os.execv(sys.executable, agent)  # nothing was passed: no agent has our stdin
    if pid is None:  # passed, unanswered: a late agent may read our stdin, so no other
        print("dmlctl: the host's agent server did not start the agent", file=sys.stderr)
        return 1
    _forward_signals(pid)
    code = ask.exit_code(conn)
    while code is None and ask.running(pid):  # the server is gone, its agent not
        time.sleep(POLL_S)
    return 1 if code is None else code


def _keepalive() -> Callable[[], None]:
    """A call that writes the agent's ``alive`` message to stdout (the controller's
    channel) once every :data:`ALIVE_S` seconds at most (:mod:`dmlctl.wire` is
    imported by the first: a server that listens already is asked without it)."""
    due = time.monotonic() + ALIVE_S

    def beat() -> None:
        nonlocal due
        if time.monotonic() >= due:
            from dmlctl import wire

            due = time.monotonic() + ALIVE_S
            with contextlib.suppress(OSError):
                os.write(1, (wire.encode(wire.AgentMsg("alive")) + "\n").encode())

    return beat


def _forward_signals(pid: int) -> None:
    def forward(signum: int, _frame: FrameType | None) -> None:
        with contextlib.suppress(OSError):
            os.kill(pid, signum)

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, forward)


def end_like(code: int) -> None:
    """Exit as the agent did: with its code, or killed by the same signal."""
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    sys.stdout.flush()
    end_like(main(sys.argv[1:]))

"""dmlctl — distributed PyTorch training on machines reachable over SSH.

Training scripts use the runtime API::

    import dmlctl
    ctx = dmlctl.init()
    model, opt = ctx.prepare(model, opt)
    for batch in ctx.shard(dataset, batch_size=64, epochs=5): ...
    ctx.log(loss=loss)

Importing ``dmlctl`` itself is cheap and never imports torch: the runtime is loaded
on first use of :func:`init` / :func:`log`, so the CLI stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from dmlctl.runtime.context import Context


def init(**kwargs: Any) -> Context:
    """Join the run and return its context (see :func:`dmlctl.runtime.session.init`)."""
    from dmlctl.runtime.session import init as _init

    return _init(**kwargs)


def log(**metrics: Any) -> None:
    """Record metrics for this rank on the current context (see ``Context.log``)."""
    from dmlctl.runtime.session import current

    current().log(**metrics)


__all__ = ["__version__", "init", "log"]

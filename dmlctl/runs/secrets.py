"""The real env values of a run, kept apart from its plan (``secrets.json``, 0600).

``plan.json`` and the stored specs hold every value of the job's and cluster's
``env`` as ``***``, each script argument that holds a secret in its redacted form,
and the other values the run hides (:attr:`~dmlctl.plan.model.LaunchPlan.secrets`)
as ``***``, so they can be read, copied and attached to bug reports; the values
themselves live only in ``secrets.json``, which the controller reads back when it
starts from the run directory (``--detach``, ``--resume``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Collection, Mapping
from typing import Any

from dmlctl.redact import REDACTED, redact_args

Secrets = dict[str, dict[str, str]]
"""Host name → {variable: real value}."""


ARGS = ":args"
"""The entry of ``secrets.json`` that holds the script arguments hidden in the plan
(``"job/3"``, ``"host:NAME/3"`` → value; ``:`` is never in a host's name)."""


SETUP = ":setup"
"""The entry of ``secrets.json`` that holds the job's ``setup`` (under ``"commands"``)
when the stored ``job.yaml`` shows it redacted (a password in a URL, a known secret):
a Slurm requeue runs it again on the new nodes."""


KEY = ":key"
"""The entry that holds the run key (:mod:`dmlctl.run_key`)."""


VALUES = ":values"
"""The entry that holds the plan's ``secrets`` (the other values the run hides), by
index."""


SLURM_SETUP = ":slurm.setup"
"""The entry that holds the cluster's ``slurm.setup`` (under ``"commands"``) when
``plan.json``'s allocation shows it redacted."""


def real_setup(secrets: Mapping[str, Mapping[str, str]]) -> str | None:
    """The job's real ``setup`` kept in ``secrets`` (None: the stored one is real)."""
    return secrets.get(SETUP, {}).get("commands")


def _keep_apart(
    secrets: Secrets, entry: str, text: str | None, redact: Callable[[str], str]
) -> str | None:
    """``text`` as ``redact`` shows it; the real one kept in ``secrets[entry]`` when
    that differs."""
    if not text or (shown := redact(text)) == text:
        return text
    secrets[entry] = {"commands": text}
    return shown


def split(
    plan: Mapping[str, Any],
    keys: Mapping[str, Collection[str]],
    redact: Callable[[str], str] = lambda text: text,
    job_setup: str | None = None,
) -> tuple[dict[str, Any], Secrets]:
    """``plan`` (a plan's JSON data) with the env values named by ``keys`` (host →
    variable names) replaced by ``***``, the script arguments that hold a secret
    (:func:`~dmlctl.redact.redact_args`: ``--token=…``, ``--password VALUE``, a bare
    token, a URL's password) shown redacted, the plan's other ``secrets`` hidden,
    and the Slurm allocation's ``setup`` as ``redact`` shows it; and the real values,
    with the job's ``job_setup`` when ``redact`` changes it (the stored job shows it
    redacted)."""
    data = copy.deepcopy(dict(plan))
    secrets: Secrets = {}
    _keep_apart(secrets, SETUP, job_setup, redact)
    if where := data.get("allocation"):
        where["setup"] = _keep_apart(secrets, SLURM_SETUP, where.get("setup"), redact)
    if run_key := data.get("key"):
        secrets[KEY] = {"key": run_key}
        data["key"] = REDACTED
    if values := data.get("secrets"):
        secrets[VALUES] = {str(i): v for i, v in enumerate(values)}
        data["secrets"] = [REDACTED] * len(values)
    args = _hide_args("job", data)
    for host in (*data.get("hosts", ()), *data.get("spares", ())):
        env = host.get("env", {})
        hidden = {k: env[k] for k in keys.get(host["name"], ()) if k in env}
        if hidden:
            secrets[host["name"]] = hidden
            env.update(dict.fromkeys(hidden, REDACTED))
        args.update(_hide_args(f"host:{host['name']}", host.get("torchrun", {})))
    if args:
        secrets[ARGS] = args
    return data, secrets


def _hide_args(where: str, holder: dict[str, Any]) -> dict[str, str]:
    """Replace ``holder["args"]`` by a list with each secret-holding argument in its
    redacted form; return the real ones by ``where/index``."""
    hidden: dict[str, str] = {}
    args = [str(a) for a in holder.get("args") or ()]
    for i, (arg, shown) in enumerate(zip(list(args), redact_args(args), strict=True)):
        if shown != arg:
            hidden[f"{where}/{i}"] = arg
            args[i] = shown
    if hidden:
        holder["args"] = args
    return hidden


def merge(plan: Mapping[str, Any], secrets: Mapping[str, Mapping[str, str]]) -> dict[str, Any]:
    """The inverse of :func:`split`."""
    data = copy.deepcopy(dict(plan))
    if data.get("allocation") and SLURM_SETUP in secrets:
        data["allocation"]["setup"] = secrets[SLURM_SETUP]["commands"]
    if KEY in secrets:
        data["key"] = secrets[KEY]["key"]
    if VALUES in secrets:
        values = secrets[VALUES]
        data["secrets"] = [values[str(i)] for i in range(len(values))]
    args = secrets.get(ARGS, {})
    _put_args(data, "job", args)
    for host in (*data.get("hosts", ()), *data.get("spares", ())):
        host.setdefault("env", {}).update(secrets.get(host["name"], {}))
        _put_args(host.get("torchrun", {}), f"host:{host['name']}", args)
    return data


def _put_args(holder: dict[str, Any], where: str, hidden: Mapping[str, str]) -> None:
    """Put the real arguments of ``where`` back into ``holder["args"]``."""
    args = list(holder.get("args") or ())
    real = {i: hidden[f"{where}/{i}"] for i in range(len(args)) if f"{where}/{i}" in hidden}
    if real:
        holder["args"] = [real.get(i, arg) for i, arg in enumerate(args)]


def redacted_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with every value ``***`` (for the stored spec copies)."""
    return dict.fromkeys(env, REDACTED)

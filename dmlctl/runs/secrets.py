"""The real env values of a run, kept apart from its plan (``secrets.json``, 0600).

``plan.json`` and the stored specs hold every value of the job's and cluster's
``env`` as ``<redacted>``, so they can be read, copied and attached to bug reports;
the values themselves live only in ``secrets.json``, which the controller reads
back when it starts from the run directory (``--detach``, ``--resume``).
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Mapping
from typing import Any

from dmlctl.redact import REDACTED

Secrets = dict[str, dict[str, str]]
"""Host name → {variable: real value}."""


def split(
    plan: Mapping[str, Any], keys: Mapping[str, Collection[str]]
) -> tuple[dict[str, Any], Secrets]:
    """``plan`` (a plan's JSON data) with the env values named by ``keys`` (host →
    variable names) replaced by ``<redacted>``, and those values."""
    data = copy.deepcopy(dict(plan))
    secrets: Secrets = {}
    for host in (*data.get("hosts", ()), *data.get("spares", ())):
        env = host.get("env", {})
        hidden = {k: env[k] for k in keys.get(host["name"], ()) if k in env}
        if hidden:
            secrets[host["name"]] = hidden
            env.update(dict.fromkeys(hidden, REDACTED))
    return data, secrets


def merge(plan: Mapping[str, Any], secrets: Mapping[str, Mapping[str, str]]) -> dict[str, Any]:
    """The inverse of :func:`split`."""
    data = copy.deepcopy(dict(plan))
    for host in (*data.get("hosts", ()), *data.get("spares", ())):
        host.setdefault("env", {}).update(secrets.get(host["name"], {}))
    return data


def redacted_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with every value ``<redacted>`` (for the stored spec copies)."""
    return dict.fromkeys(env, REDACTED)

"""Secrets by name and by value (dmlctl.redact): what is hidden, and what is not."""

from __future__ import annotations

from pathlib import Path

import pytest

from dmlctl.redact import (
    REDACTED,
    Redactor,
    args_secrets,
    command_secrets,
    high_entropy,
    redact_arg,
    redact_args,
    redact_env,
    secret_name,
    secret_values,
)

TOKENS = [
    "ghp_Zq8rT2mVx9LpW4nB7cK3yJ6dA1sE5fG0hJ2k",  # GitHub
    "hf_Zq8rT2mVx9LpW4nB7cK3yJ6d",  # Hugging Face
    "sk-proj-abc123XYZ789def456GHI012",  # OpenAI style
    "0123456789abcdef0123456789abcdef",  # a hex key
    "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",  # an AWS secret key
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N",
]
NOT_TOKENS = [
    "distilbert-base-uncased-finetuned-sst-2-english",  # model names, run names, paths
    "meta-llama/Llama-2-7b-hf",
    "model_checkpoint_epoch_12",
    "run-2026-11-23-experiment-42",
    "bench-hang-compile-20261123-163708-59da",
    "/data/imagenet/train/0123456789abcdefABCDEF",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa1",
    "eth0",
]


@pytest.mark.parametrize("value", TOKENS)
def test_generated_tokens_are_secret_by_value(value: str) -> None:
    assert high_entropy(value)
    assert redact_env({"SOME_VALUE": value}) == {"SOME_VALUE": REDACTED}


@pytest.mark.parametrize("value", NOT_TOKENS)
def test_names_made_of_words_and_numbers_are_not(value: str) -> None:
    assert not high_entropy(value)
    assert redact_env({"MODEL_NAME": value}) == {"MODEL_NAME": value}


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("API_TOKEN", True),
        ("db_password", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("HF_API_KEY", True),
        ("PATH", False),
        ("LR", False),
        ("NCCL_SOCKET_IFNAME", False),
    ],
)
def test_secret_by_name(name: str, secret: bool) -> None:
    assert secret_name(name) is secret


def test_only_the_password_of_a_url_is_hidden() -> None:
    env = {"DB_URL": "postgres://u:s3cret-xyz@h:5432/db", "HOME": "/root"}
    assert redact_env(env) == {"DB_URL": "postgres://u:***@h:5432/db", "HOME": "/root"}
    assert secret_values(env) == ["s3cret-xyz"]
    assert redact_arg("--db=postgres://u:pw12345@h/db") == "--db=postgres://u:***@h/db"
    assert redact_arg("--token=abc") == "--token=***"
    assert redact_arg(TOKENS[0]) == REDACTED


def test_dmlctl_own_variables_are_never_secret() -> None:
    env = {"DMLCTL_RUN_ID": "job-20261123-190110-f6ac", "DMLCTL_TOKEN": TOKENS[0]}
    assert secret_values(env) == [] and redact_env(env) == env


def test_the_redactor_hides_known_values_wherever_they_stand() -> None:
    redactor = Redactor.for_envs([{"API_TOKEN": "tok-abc-123456", "X": TOKENS[1], "Y": "short"}])
    assert redactor.active
    line = f"using tok-abc-123456 and {TOKENS[1]}; see https://a:pw123456@h/x; short"
    assert redactor.needed(line)
    assert redactor.text(line) == ("using *** and ***; see https://a:***@h/x; short")
    assert not redactor.needed("nothing to hide here")
    assert not Redactor().active and Redactor().text("plain") == "plain"


def test_a_plans_secret_arguments_are_stored_redacted_and_put_back_whole() -> None:
    from dmlctl.runs import secrets

    token = "--token=ghp_Zq8rT2mVx9LpW4nB7cK3yJ6dQ1"
    args = ["--epochs", "3", token, "postgres://u:pw-123456@h/db"]
    plan = {
        "args": tuple(args),  # as LaunchPlan.to_dict() gives them
        "hosts": [{"name": "a", "env": {"K": "v"}, "torchrun": {"args": list(args)}}],
        "spares": [{"name": "b", "env": {}, "torchrun": {"args": list(args)}}],
    }
    shown, hidden = secrets.split(plan, {"a": ["K"]})
    redacted = ["--epochs", "3", "--token=***", "postgres://u:***@h/db"]
    assert shown["args"] == redacted
    assert [h["torchrun"]["args"] for h in shown["hosts"] + shown["spares"]] == [redacted] * 2
    assert "ghp_" not in str(shown) and "pw-123456" not in str(shown)
    assert plan["args"] == tuple(args)  # the plan itself is left as it was
    back = secrets.merge(shown, hidden)
    assert back["args"] == args and back["hosts"] == plan["hosts"]
    assert back["spares"] == plan["spares"]


def test_a_slurm_setup_with_a_secret_is_stored_redacted_and_put_back_whole(
    tmp_path: Path,
) -> None:
    """The allocation's ``slurm.setup`` in ``plan.json`` is shown as the run's redactor
    shows it, the real one kept in ``secrets.json``; a requeue's ``allocation.json``
    keeps no setup, and reads the planned one back."""
    from dmlctl.runs import secrets
    from dmlctl.slurm.allocation import Allocation
    from dmlctl.slurm.record import record, recorded

    setup = "pip install --index-url https://u:pw-in-url@pypi.example/simple x"
    plan = {"hosts": [], "allocation": {"job_id": "7", "nodes": {}, "setup": setup}}
    shown, hidden = secrets.split(plan, {}, Redactor().text)
    assert "pw-in-url" not in str(shown) and "u:***@pypi" in shown["allocation"]["setup"]
    assert secrets.merge(shown, hidden)["allocation"]["setup"] == setup
    plain = {"hosts": [], "allocation": {"job_id": "7", "nodes": {}, "setup": "module load x"}}
    assert secrets.split(plain, {}, Redactor().text)[1] == {}  # nothing to keep apart
    planned = Allocation("7", {"a": "n1"}, setup=setup)
    record(tmp_path, planned.moved("8", {"a": "n2"}))
    assert "pw-in-url" not in (tmp_path / "allocation.json").read_text()
    back = recorded(tmp_path, planned)
    assert back is not None and (back.job_id, back.setup) == ("8", setup)


def test_a_flags_value_is_hidden_in_both_forms_and_the_rest_stays() -> None:
    args = ["--password", "plainpass99", "--api-key=AKIAxyz12345", "--lr", "0.1", "data"]
    assert redact_args(args) == ["--password", REDACTED, "--api-key=***", "--lr", "0.1", "data"]
    assert args_secrets(args) == ["plainpass99", "AKIAxyz12345"]
    # a flag after a secret-named flag is no value of it
    assert redact_args(["--no-password", "--lr", "0.1"]) == ["--no-password", "--lr", "0.1"]


def test_a_setup_commands_secrets_are_found_and_only_they_hidden() -> None:
    setup = (
        "export GITHUB_TOKEN=plain-exported-1 DEBUG=1 && curl -H 'Authorization: Bearer "
        "bearer-tok-2' https://u:url-pass-3@example.com/x && ./login --password pw-flag-4 "
        "&& pip install -r requirements.txt"
    )
    found = command_secrets(setup)
    assert set(found) == {"plain-exported-1", "bearer-tok-2", "url-pass-3", "pw-flag-4"}
    shown = Redactor(found).text(setup)
    assert shown == (
        "export GITHUB_TOKEN=*** DEBUG=1 && curl -H 'Authorization: Bearer ***' "
        "https://u:***@example.com/x && ./login --password *** && pip install -r requirements.txt"
    )
    assert command_secrets("echo 'unbalanced TOKEN=abcdefgh") == ["abcdefgh"]


def test_data_keeps_its_shape_so_yaml_quotes_the_mask() -> None:
    import yaml

    redactor = Redactor(["listed-value-555"])
    data = {"secrets": ["listed-value-555"], "setup": "x listed-value-555 y", "n": 3}
    shown = redactor.data(data)
    assert shown == {"secrets": [REDACTED], "setup": "x *** y", "n": 3}
    assert yaml.safe_load(yaml.safe_dump(shown)) == shown  # '***' is no YAML alias


def test_every_event_that_carries_text_has_its_secrets_hidden() -> None:
    from dmlctl.failure import Evidence, Failure, Kind
    from dmlctl.runs.events import MetricRecord, Progress, RankRespawned
    from dmlctl.runs.redaction import redact_events

    secret = "hunter-22-secret"
    cause = Failure("a", 1, "RuntimeError", f"bad {secret}", (f"  at {secret}",),
                    kind=Kind.USER, evidence=Evidence.RECORD)  # fmt: skip
    events = [
        Progress(f"connecting with {secret}", 1.0),
        MetricRecord("a", 0, 1, {"note": f"key={secret}", "loss": 0.5}, 1.0),
        RankRespawned("a", 1, cause, 42, 1.0),
    ]
    shown = redact_events(Redactor([secret]), events)
    assert secret not in repr(shown)
    assert shown[1].values == {"note": "key=***", "loss": 0.5}  # type: ignore[union-attr]
    assert shown[2].cause.message == "bad ***"  # type: ignore[union-attr]
    plain = [Progress("nothing to hide", 1.0)]
    assert redact_events(Redactor([secret]), plain)[0] is plain[0]


def test_the_ranks_own_files_are_masked_in_place_and_checkpoints_left(tmp_path: Path) -> None:
    from dmlctl.masking import mask_files

    secret = "hunter-22-secret"
    rank_out = tmp_path / "hosts" / "local" / "rank-0.stdout"
    rank_out.parent.mkdir(parents=True)
    rank_out.write_text(f"token {secret}\n")
    rank_out.chmod(0o600)
    kept = tmp_path / "secrets.json"
    kept.write_text(f'{{"T": "{secret}"}}')
    weights = tmp_path / "hosts" / "local" / "checkpoints" / "step-1" / "rank-0.pt"
    weights.parent.mkdir(parents=True)
    weights.write_bytes(secret.encode())  # binary: never rewritten
    assert mask_files(tmp_path, Redactor([secret])) == [rank_out]
    assert rank_out.read_text() == "token ***\n" and oct(rank_out.stat().st_mode)[-3:] == "600"
    assert secret in kept.read_text() and weights.read_bytes() == secret.encode()

"""`statusgate policy test` and `statusgate schema`: the real command, as an operator runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from gateway.demo.env import demo_env

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "config" / "gateway.yaml"
ENV = {**os.environ, **demo_env(ROOT / "policies", "k-test"), "DEMO_API_KEY": "k-test"}


def statusgate(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.run", *args],
        input=stdin,
        capture_output=True,
        env=ENV,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("body", "status", "expected"),
    [
        ({"state": "running"}, 200, "pending"),
        ({"state": "succeeded", "result": {"pages": 1}}, 200, "succeeded"),
        ({"state": "failed"}, 200, "failed"),
        ({"state": "succeeded"}, 200, "pending"),  # no result yet: still pending
        ({"state": "paused"}, 200, 'escalate unknown_state: state "paused" is not in'),
        ({}, 403, "escalate authorization_denied: the provider answered 403"),
    ],
)
def test_policy_test_classifies_a_sample_answer(
    tmp_path: Path, body: dict[str, object], status: int, expected: str
) -> None:
    """One line per sample, the same verdict a live status answer would get; the exit status
    is 3 when the verdict is an escalation, 0 otherwise."""
    sample = tmp_path / "sample.json"
    sample.write_text(json.dumps(body))
    args = ["policy", "test", "--config", str(CONFIG), "--status", str(status), "demo-jobs"]
    done = statusgate(*args, str(sample))
    assert done.returncode == (3 if expected.startswith("escalate") else 0), done.stderr
    assert done.stdout.decode().startswith(expected)
    assert done.stdout.decode().count("\n") == 1


def test_policy_test_reads_stdin_and_names_unknown_providers() -> None:
    """``-`` reads the sample from stdin; an unknown provider is one clear line, exit 1."""
    done = statusgate(
        "policy", "test", "--config", str(CONFIG), "batch-api", "-", stdin=b'{"status": "failed"}'
    )
    assert done.stdout.decode() == "failed\n"
    missing = statusgate("policy", "test", "--config", str(CONFIG), "nope", "-")
    assert missing.returncode == 1
    assert b"no policy for 'nope'" in missing.stderr and b"Traceback" not in missing.stderr


def test_shipped_files_validate_against_the_schemas() -> None:
    """The JSON Schemas are generated from the validating models and accept every shipped
    policy and the shipped config, and refuse an unknown key."""
    policy_schema = json.loads(statusgate("schema", "policy").stdout)
    config_schema = json.loads(statusgate("schema", "config").stdout)
    assert policy_schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    validator = jsonschema.Draft202012Validator(policy_schema)
    policies = sorted((ROOT / "policies").glob("*.yaml"))
    assert policies
    for path in policies:
        errors = list(validator.iter_errors(yaml.safe_load(path.read_text())))
        assert errors == [], (path.name, [e.message for e in errors])
    jsonschema.validate(yaml.safe_load(CONFIG.read_text()), config_schema)
    broken = {**yaml.safe_load((ROOT / "policies/demo-jobs.yaml").read_text()), "pollng": {}}
    assert list(validator.iter_errors(broken))


def test_schemas_describe_every_field_with_defaults_check_accepts() -> None:
    """Every property of both schemas has a description, and every duration or size default
    is written as check reads it ("5s", not 5.0)."""
    from gateway.settings.units import parse_duration, parse_size

    for kind in ("policy", "config"):
        document = json.loads(statusgate("schema", kind).stdout)
        models = [document, *document["$defs"].values()]
        for model in models:
            for name, prop in model.get("properties", {}).items():
                assert prop.get("description"), (kind, name)
                pattern, default = prop.get("pattern", ""), prop.get("default")
                if default is not None and pattern.endswith("(ms|s|m|h|d)$"):
                    parse_duration(default)
                if default is not None and "MiB" in pattern:
                    parse_size(default)
        polling = document["$defs"].get("Polling", {}).get("properties", {})
        if polling:
            assert polling["base_delay"]["default"] == "5s"
            assert polling["deadline"]["default"] == "40m"

"""`statusgate check`: every invalid case of SPEC section 3 gives file: field: message."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway import ConfigError
from gateway.run.cli import main

from conftest import PROVIDER_ENV, ROOT, merge, write_config


def run_check(config: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["check", "--config", str(config)])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(autouse=True)
def demo_key(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROVIDER_ENV:
        monkeypatch.setenv(name, "secret-value-never-printed")


def test_repository_config_passes(capsys: pytest.CaptureFixture[str]) -> None:
    """The shipped config and all shipped policies are valid."""
    code, out, err = run_check(ROOT / "config/gateway.yaml", capsys)
    assert code == 0, err
    assert out.count("\n") == 1
    shipped = sorted(p.stem for p in (ROOT / "policies").glob("*.yaml"))
    assert f"{len(shipped)} policies ({', '.join(shipped)})" in out


BAD_POLICIES: list[tuple[dict[str, Any], str, str]] = [
    ({"surprise": 1}, "surprise", "unknown key"),
    ({"polling": {"base_delay": "5s", "typo_delay": "1s"}}, "polling.typo_delay", "unknown key"),
    ({"states": {"failure": ["running"]}}, "states.failure[0]", "also listed in states.pending"),
    ({"polling": {"base_delay": "60s", "max_delay": "30s"}}, "polling.base_delay", "max_delay"),
    ({"polling": {"jitter": {"min": -0.1, "max": 1}}}, "polling.jitter.min", "greater than"),
    ({"polling": {"jitter": {"min": 0.5, "max": 1.5}}}, "polling.jitter.max", "less than"),
    ({"polling": {"jitter": {"min": 0.9, "max": 0.5}}}, "polling.jitter.min", "jitter.max"),
    ({"upstream": "ftp://files.example"}, "upstream", "http:// or https://"),
    ({"upstream": "api.example.com"}, "upstream", "http:// or https://"),
    ({"routes": {"status": {"path": "/v1/jobs/latest"}}}, "routes.status.path", "{job_id}"),
    ({"polling": {"base_delay": "5 seconds"}}, "polling.base_delay", 'duration like "5s"'),
    ({"polling": {"max_status_requests": "12"}}, "polling.max_status_requests", "integer"),
    ({"provider": "Acme_Extract"}, "provider", "[a-z0-9-]+"),
    ({"usage": {"Input Tokens": "usage.input"}}, "usage", "must match [a-z][a-z0-9_]"),
    ({"usage": {"cost": "usage..total"}}, "usage", "usage.cost: 'usage..total' is not a dotted"),
    ({"usage": {"cost": ["usage"]}}, "usage.cost", "string"),
    (
        {"credential": {"header": "Authorization", "value": "${NOT_SET_ANYWHERE}"}},
        "credential.value",
        "NOT_SET_ANYWHERE is not set",
    ),
]


@pytest.mark.parametrize(("change", "field", "message"), BAD_POLICIES)
def test_invalid_policy_is_rejected_with_file_and_field(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    change: dict[str, Any],
    field: str,
    message: str,
) -> None:
    """Each invalid policy case fails check with a file: field: message line and no traceback or
    secret."""
    config = write_config(tmp_path, "https://api.example.com", policy_changes={"demo-jobs": change})
    code, out, err = run_check(config, capsys)
    assert code == 1
    lines = err.strip().splitlines()
    matching = [
        line for line in lines if line.startswith(f"{tmp_path}/policies/demo-jobs.yaml: {field}: ")
    ]
    assert matching, err
    assert message in matching[0]
    assert "Traceback" not in err + out
    assert "secret-value-never-printed" not in err + out


def test_missing_required_field_and_bad_yaml(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing required section and a YAML syntax error are both reported in one run, each
    naming its file."""
    config = write_config(tmp_path, "https://api.example.com")
    policy = tmp_path / "policies/demo-jobs.yaml"
    data = yaml.safe_load(policy.read_text())
    del data["states"]
    policy.write_text(yaml.safe_dump(data))
    (tmp_path / "policies/broken.yaml").write_text("provider: [unclosed\n")
    code, _, err = run_check(config, capsys)
    assert code == 1
    assert f"{tmp_path}/policies/demo-jobs.yaml: states: is required" in err
    assert f"{tmp_path}/policies/broken.yaml: line " in err


BAD_CONFIGS: list[tuple[dict[str, Any], str, str]] = [
    ({"limits": {"max_request_body": "lots"}}, "limits.max_request_body", "size like"),
    ({"limits": {"upstream_timeout": "30"}}, "limits.upstream_timeout", "duration"),
    ({"limits": {"max_in_flight": 0}}, "limits.max_in_flight", "greater than or equal to 1"),
    (
        {"accounts": [{"id": "x", "token_sha256": "abc", "providers": ["*"]}]},
        "accounts[0].token_sha256",
        "sha256",
    ),
    (
        {"accounts": [{"id": "x", "token_sha256": "a" * 64, "providers": ["nope"]}]},
        "accounts[0].providers[0]",
        "no policy for 'nope'",
    ),
    ({"listen": {"port": "8080"}}, "listen.port", "integer"),
    ({"extra": True}, "extra", "unknown key"),
]


@pytest.mark.parametrize(("change", "field", "message"), BAD_CONFIGS)
def test_invalid_gateway_config(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    change: dict[str, Any],
    field: str,
    message: str,
) -> None:
    """Each invalid gateway config case fails check naming the config file and the field."""
    config = write_config(tmp_path, "https://api.example.com")
    data = merge(yaml.safe_load(config.read_text()), change)
    if "accounts" in change:
        data["accounts"] = change["accounts"]
    config.write_text(yaml.safe_dump(data))
    code, _, err = run_check(config, capsys)
    assert code == 1
    assert f"{config}: {field}: " in err, err
    assert message in err


def test_check_as_a_real_command_prints_no_traceback(tmp_path: Path) -> None:
    """The installed entry point, given a bad policy, prints lines and exits 1."""
    config = write_config(tmp_path, "gopher://x", policy_changes={"demo-jobs": {"nope": 1}})
    done = subprocess.run(
        [sys.executable, "-m", "gateway.run", "check", "--config", str(config)],
        capture_output=True,
        text=True,
        env={**PROVIDER_ENV, "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert f"{tmp_path}/policies/demo-jobs.yaml: upstream: " in done.stderr
    assert f"{tmp_path}/policies/demo-jobs.yaml: nope: unknown key" in done.stderr


def test_token_hash(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """token hash prints the sha256 hex digest the shipped config stores for the demo agent
    token."""
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("demo-agent-token\n"))
    assert main(["token", "hash"]) == 0
    digest = capsys.readouterr().out.strip()
    assert digest in (ROOT / "config/gateway.yaml").read_text()


def test_every_problem_of_every_phase_in_one_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One run reports field errors, cross-field rules, missing variables, accounts and the
    store together, not one phase at a time."""
    change = {
        "credential": {"header": "Authorization", "value": "Bearer ${NOT_SET_ANYWHERE}"},
        "polling": {"max_status_requests": "12", "base_delay": "60s", "max_delay": "30s"},
        "routes": {"status": {"path": "/v1/jobs/latest"}},
    }
    config = write_config(
        tmp_path,
        "https://api.example.com",
        policy_changes={"demo-jobs": change},
        config_changes={"store": "mongodb://x", "limits": {"upstream_timeout": "30"}},
    )
    data = yaml.safe_load(config.read_text())
    data["accounts"][0]["providers"] = ["nope"]
    data["operators"][0]["token_sha256"] = "abc"  # invalid, so this operator is left out
    config.write_text(yaml.safe_dump(data))
    code, _, err = run_check(config, capsys)
    assert code == 1
    assert f"{config}: operators[0].token_sha256: must be a lowercase sha256" in err
    policy = f"{tmp_path}/policies/demo-jobs.yaml"
    for expected in (
        f"{policy}: credential.value: environment variable NOT_SET_ANYWHERE is not set",
        f"{policy}: polling.max_status_requests: ",
        f"{policy}: polling.base_delay: must not be greater than polling.max_delay",
        f"{policy}: routes.status.path: must contain {{job_id}}",
        f"{config}: limits.upstream_timeout: ",
        f"{config}: accounts[0].providers[0]: no policy for 'nope'",
        f"{config}: store: scheme 'mongodb'",
    ):
        assert expected in err, (expected, err)


def test_cross_checks_skip_fields_already_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A field that failed validation is not reported again by a cross-field rule that saw
    its default instead."""
    change = {"polling": {"base_delay": "lots", "max_delay": "1s"}}
    config = write_config(tmp_path, "https://x.example", policy_changes={"demo-jobs": change})
    code, _, err = run_check(config, capsys)
    assert code == 1
    lines = [line for line in err.splitlines() if "polling.base_delay" in line]
    assert len(lines) == 1 and 'duration like "5s"' in lines[0], err


@pytest.mark.parametrize(
    ("value", "env", "message"),
    [
        ("Bearer $DEMO_API_KEY", {}, "$DEMO_API_KEY is sent as written: write ${DEMO_API_KEY}"),
        ("Bearer ${EMPTY_KEY}", {"EMPTY_KEY": ""}, "environment variable EMPTY_KEY is empty"),
    ],
)
def test_bare_and_empty_variables_are_problems(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    value: str,
    env: dict[str, str],
    message: str,
) -> None:
    """A credential that would be sent as the literal text "Bearer $KEY", or as "Bearer ",
    fails check naming the field and the variable."""
    for name, setting in env.items():
        monkeypatch.setenv(name, setting)
    change = {"credential": {"header": "Authorization", "value": value}}
    config = write_config(tmp_path, "https://x.example", policy_changes={"demo-jobs": change})
    code, _, err = run_check(config, capsys)
    assert code == 1
    assert f"{tmp_path}/policies/demo-jobs.yaml: credential.value: {message}" in err, err
    assert "secret-value-never-printed" not in err


def test_double_dollar_is_a_literal_dollar(tmp_path: Path) -> None:
    """``$$`` writes one ``$`` and is not read as a variable."""
    from gateway.settings.loading import interpolate

    data, problems = interpolate({"a": "pa$$word $${HOME}"}, "f.yaml", {})
    assert problems == [] and data == {"a": "pa$word ${HOME}"}


def test_yaml_errors_keep_line_column_and_caret(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A YAML syntax error names line and column and shows the line with a caret under it."""
    config = write_config(tmp_path, "https://x.example")
    (tmp_path / "policies/broken.yaml").write_text("provider: demo\nupstream: 'unclosed\n")
    (tmp_path / "policies/flow.yaml").write_text("provider: x\nstates: {a: [1, 2}\n")
    code, _, err = run_check(config, capsys)
    assert code == 1
    assert f"{tmp_path}/policies/flow.yaml: line 2, column 18: " in err, err
    assert "\n    states: {a: [1, 2}\n" + " " * 21 + "^\n" in err, err
    assert f"{tmp_path}/policies/broken.yaml: line " in err


def test_secret_from_a_mounted_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``${file:/path}`` reads a mounted secret (final newline dropped, relative paths from
    the file's folder); an unreadable file is named without any value."""
    from gateway.settings.config import load_settings

    secret = tmp_path / "provider-key"
    secret.write_text("from-a-file-4f9a\n")
    value = {"credential": {"header": "Authorization", "value": f"Bearer ${{file:{secret}}}"}}
    config = write_config(tmp_path, "https://x.example", policy_changes={"demo-jobs": value})
    assert load_settings(config).policies["demo-jobs"].credential.value == "Bearer from-a-file-4f9a"
    relative = {"credential": {"header": "Authorization", "value": "${file:../provider-key}"}}
    config = write_config(tmp_path, "https://x.example", policy_changes={"demo-jobs": relative})
    assert load_settings(config).policies["demo-jobs"].credential.value == "from-a-file-4f9a"
    secret.unlink()
    with pytest.raises(ConfigError) as caught:
        load_settings(config)
    assert any("secret file ../provider-key: cannot read" in p for p in caught.value.problems)


def test_readme_check_commands_work_in_a_second_shell(tmp_path: Path) -> None:
    """README's "check before deploying" commands, pasted into a shell where `make run`
    never ran (no DEMO_API_KEY), pass check, print the escalation verdict with exit 3 and
    write a JSON Schema."""
    import json
    import re

    readme = (ROOT / "README.md").read_text()
    found = re.search(r"```sh\n([^`]*statusgate check[^`]*)```", readme)
    assert found, "README has no check block"
    shim = tmp_path / "statusgate"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m gateway.run "$@"\n')
    shim.chmod(0o755)
    commands = [
        line.replace(".venv/bin/statusgate", str(shim))
        + ("" if 'echo "exit $?"' in line else '; echo "exit $?"')
        for line in found.group(1)
        .replace("policy.schema.json", str(tmp_path / "s.json"))
        .splitlines()
        if line.strip() and not line.startswith("#")
    ]
    done = subprocess.run(
        ["bash", "-c", "\n".join(commands)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)},
        timeout=120,
        check=False,
    )
    out = done.stdout.splitlines()
    assert "config/gateway.yaml: ok: " in done.stdout, done.stdout + done.stderr
    verdict = out.index(
        'escalate unknown_state: state "paused" is not in the policy\'s state table'
    )
    assert out[verdict + 1] == "exit 3"
    exits = [line for line in out if line.startswith("exit")]
    assert exits == ["exit 0", "exit 0", "exit 3", "exit 0"], done.stdout + done.stderr
    assert json.loads((tmp_path / "s.json").read_text())["title"].startswith("Statusgate")


def test_check_reports_every_invalid_field_of_a_policy_in_one_run(tmp_path: Path) -> None:
    """`statusgate check` on a policy with a non-http upstream, base_delay over max_delay and
    a status path without {job_id} prints one message for each of the three fields, in one run
    (SPEC 20a), even though the upstream alone makes the file invalid."""
    change = {
        "upstream": "ftp://nowhere",
        "polling": {"base_delay": "10m", "max_delay": "1s"},
        "routes": {"status": {"path": "/v1/jobs/latest"}},
    }
    config = write_config(tmp_path, "https://x.example", policy_changes={"demo-jobs": change})
    done = subprocess.run(
        [sys.executable, "-m", "gateway.run", "check", "--config", str(config)],
        capture_output=True,
        text=True,
        env={"DEMO_API_KEY": "k", "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert done.returncode == 1
    policy = f"{tmp_path}/policies/demo-jobs.yaml"
    lines = [line for line in done.stderr.splitlines() if line.startswith(f"{policy}: ")]
    fields = sorted(line.removeprefix(f"{policy}: ").partition(": ")[0] for line in lines)
    assert fields == ["polling.base_delay", "routes.status.path", "upstream"], done.stderr
    assert "Traceback" not in done.stderr

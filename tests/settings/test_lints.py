"""SPEC 22, Lints: ``statusgate check`` warns (exit 0, one line each) about states a shape
knows that no class lists, terminal classes a shape expects that a policy leaves absent (an
explicit ``[]`` says "none"), empty success or failure classes, and result routes whose
pointer a success answer need not carry; and about none of the shipped policies."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway import ConfigError
from gateway.demo.env import demo_env
from gateway.run.cli import main
from gateway.settings.lints import check_warnings, lint
from gateway.settings.policy import ProviderPolicy, load_policy

from conftest import ROOT, merge, write_config

ENV = {
    **demo_env(ROOT / "policies", "k-123456"),  # every key the shipped policies read
    "DEMO_API_KEY": "k-123456",
    "AWS_ACCESS_KEY_ID": "a-123456",
    "AWS_SECRET_ACCESS_KEY": "s-123456",
}


def policy(**fields: Any) -> ProviderPolicy:
    base: dict[str, Any] = {
        "provider": "p",
        "upstream": "https://api.example",
        "credential": {"header": "Authorization", "value": "Bearer k-123456"},
        "routes": {"submit": {"path": "/v1/jobs"}, "status": {"path": "/v1/jobs/{job_id}"}},
        "states": {"pending": ["queued"], "success": ["done"], "failure": ["failed"]},
    }
    if fields.get("shape") in ("google-job", "google-operation"):
        base["routes"] = {"submit": {"path": "/v1/{parent}/jobs"}}
        base["states"] = {}
    if fields.get("shape") == "aws-job":
        base["credential"] = {"aws_sigv4": {"service": "bedrock", "region": "us-east-1"}}
    if fields.get("shape") in ("aws-job", "queue", None):
        base["routes"]["submit"]["job_id"] = {"from": "body", "path": "id"}
    if fields.get("shape") is None:
        base["states"]["field"] = "state"
    return _load(merge(base, fields))


def _load(data: dict[str, Any]) -> ProviderPolicy:
    from gateway.settings.loading import interpolate
    from gateway.settings.shapes import with_shape

    tree, problems = interpolate(with_shape(data), "p.yaml", ENV)
    assert problems == []
    return ProviderPolicy.model_validate(tree)


def fields_warned(found: list[tuple[str, str]]) -> list[str]:
    return [where for where, _ in found]


def test_a_google_job_policy_missing_a_job_state_is_warned_about() -> None:
    """google-job knows every JOB_STATE_*: a policy whose pending list leaves out
    JOB_STATE_PAUSED gets one warning naming it and its documented class; the shape's own
    table gets none."""
    assert lint(policy(shape="google-job")) == []
    found = lint(
        policy(
            shape="google-job",
            states={"pending": ["JOB_STATE_QUEUED", "JOB_STATE_PENDING", "JOB_STATE_RUNNING"]},
        )
    )
    messages = [m for _, m in found]
    assert len(found) == 3  # CANCELLING, PAUSED, UPDATING
    assert any(m.startswith('"JOB_STATE_PAUSED" (Vertex AI JobState') for m in messages)
    assert all("documented as pending" in m for m in messages)


def test_gemini_batch_states_are_checked_against_their_own_vocabulary() -> None:
    """A google-job policy written in Gemini's BATCH_STATE_* is checked against that
    vocabulary, not warned about every JOB_STATE_* it does not list."""
    gemini = {
        "field": "metadata.state",
        "pending": ["BATCH_STATE_PENDING", "BATCH_STATE_RUNNING"],
        "success": ["BATCH_STATE_SUCCEEDED"],
        "failure": ["BATCH_STATE_FAILED"],
        "cancelled": ["BATCH_STATE_CANCELLED"],
        "expired": ["BATCH_STATE_EXPIRED"],
    }
    assert lint(policy(shape="google-job", states=gemini)) == []
    partial = {**gemini, "expired": []}
    found = lint(policy(shape="google-job", states=partial))
    assert [m.split(" ")[0] for _, m in found] == ['"BATCH_STATE_EXPIRED"']


def test_google_operation_warns_when_absent_done_is_left_out() -> None:
    """google-operation knows ``done`` is absent (null) while running: a pending class of
    only ``false`` is warned about."""
    found = lint(policy(shape="google-operation", states={"pending": [False]}))
    assert len(found) == 1 and found[0][1].startswith("null (google.longrunning")


@pytest.mark.parametrize("shape", ["openai-job", "aws-job", "queue"])
def test_expected_terminal_classes_absent_warn_and_written_empty_do_not(shape: str) -> None:
    """A shape whose members' states differ names the terminal classes it expects: each one
    the policy leaves absent warns; written as ``[]`` ("this provider has none") it does not."""
    expects = {"openai-job": ["cancelled", "expired"], "aws-job": ["cancelled", "expired"]}
    classes = expects.get(shape, ["cancelled"])
    absent = lint(policy(shape=shape))
    assert fields_warned(absent) == [f"states.{kind}" for kind in classes]
    assert all("write" in m and ": []" in m for _, m in absent)
    written = lint(policy(shape=shape, states={kind: [] for kind in classes}))
    assert written == []


def test_empty_success_or_failure_classes_warn() -> None:
    """An empty success class always warns; a failure class warns when absent, not when
    written as [] or when failure_if_present stands for it."""
    assert fields_warned(lint(policy(states={"success": []}))) == ["states.success"]
    absent = _load(
        {
            "provider": "p",
            "upstream": "https://api.example",
            "credential": {"header": "Authorization", "value": "Bearer k-123456"},
            "routes": {
                "submit": {"path": "/v1/jobs", "job_id": {"from": "body", "path": "id"}},
                "status": {"path": "/v1/jobs/{job_id}"},
            },
            "states": {"field": "state", "pending": ["queued"], "success": ["done"]},
        }
    )
    assert fields_warned(lint(absent)) == ["states.failure"]
    assert lint(policy(states={"failure": []})) == []
    assert lint(policy(states={"failure": [], "failure_if_present": ["error"]})) == []


def test_a_result_route_whose_pointer_success_need_not_carry_warns() -> None:
    """A result route reading {final.X} warns unless success_requires names X; a result
    route by job id warns when success_requires is empty."""
    by_value = {"result": {"path": "/v1/files/{final.output_file_id}/content"}}
    found = lint(policy(routes=by_value))
    assert fields_warned(found) == ["states.success_requires"]
    assert "output_file_id" in found[0][1]
    required = {"success_requires": [{"path": "output_file_id", "allow_null": True}]}
    assert lint(policy(routes=by_value, states=required)) == []
    by_id = {"result": {"path": "/v1/jobs/{job_id}/result"}}
    assert fields_warned(lint(policy(routes=by_id))) == ["states.success_requires"]
    assert lint(policy(routes=by_id, states={"success_requires": ["result"]})) == []


def test_no_shipped_policy_has_a_check_warning() -> None:
    """Every shipped policy passes check without a warning of any kind."""
    for path in sorted((ROOT / "policies").glob("*.yaml")):
        found = check_warnings(load_policy(path, path.name, ENV))
        assert found == [], (path.name, found)


def test_check_prints_one_line_a_warning_and_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """statusgate check exits 0 with the summary line on stdout and one
    ``file: policy NAME: field: warning: message`` line a warning on stderr."""
    for name in demo_env(ROOT / "policies", "k-123456"):
        monkeypatch.setenv(name, "k-123456")
    config = write_config(tmp_path, "http://127.0.0.1:8081")
    google = tmp_path / "policies/google-operations.yaml"
    data = yaml.safe_load(google.read_text())
    data["states"] = {"pending": [False]}
    google.write_text(yaml.safe_dump(data))
    code = main(["check", "--config", str(config)])
    out, err = capsys.readouterr()
    assert code == 0 and out.count("\n") == 1
    lines = err.splitlines()
    assert lines == [
        f"{config}: policy google-operations: states: warning: null (google.longrunning."
        "Operation done, documented as pending) is in no class: an answer with it escalates "
        "as unknown_state"
    ]


def test_a_public_passthrough_get_is_not_warned_about() -> None:
    """A passthrough GET by id of public provider data (Replicate's model versions) marked
    ``public: true`` gets no warning; the same route unmarked does; ``public`` on a call
    that is not a GET fails check."""
    route = {"method": "GET", "path": "/v1/models/{owner}/{name}/versions/{version_id}"}
    marked = policy(routes={"passthrough": [{**route, "public": True}]})
    assert check_warnings(marked) == []
    unmarked = policy(routes={"passthrough": [route]})
    assert fields_warned(check_warnings(unmarked)) == ["routes.passthrough[0]"]
    path = ROOT / "policies" / "replicate.yaml"
    data = yaml.safe_load(path.read_text())
    data["routes"]["passthrough"] = [{"method": "POST", "path": "/v1/files", "public": True}]
    with pytest.raises(ConfigError) as failed:
        _load_file(data)
    assert any(
        "routes.passthrough[0].public: only a GET may be public" in p for p in failed.value.problems
    ), failed.value.problems


def _load_file(data: dict[str, Any]) -> ProviderPolicy:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "p.yaml"
        path.write_text(yaml.safe_dump(data))
        return load_policy(path, "p.yaml", ENV)

"""SPEC 22, Shapes: ``shape: <name>`` fills a family's defaults under the policy file,
whatever the file writes wins; ``statusgate policy show`` prints the effective policy; the
shipped policies that use a shape take effect as they did before they used it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway import ConfigError
from gateway.demo.env import demo_env
from gateway.settings.config import load_settings
from gateway.settings.policy import ProviderPolicy, load_policy
from gateway.settings.shapes import SHAPES, merge_under, with_shape

from conftest import ROOT

ENV = {
    **demo_env(ROOT / "policies", "k-secret-never-shown"),  # every key the policies read
    "AWS_ACCESS_KEY_ID": "AKIA-never-shown-1",
}
ENV["AWS_SECRET_ACCESS_KEY"] = "aws-secret-never-shown"
UNSHAPED = Path(__file__).parent / "data" / "unshaped"


def load(tmp_path: Path, data: dict[str, Any], env: dict[str, str] | None = None) -> ProviderPolicy:
    path = tmp_path / f"{data.get('provider', 'p')}.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_policy(path, path.name, env or ENV)


def minimal(shape: str, **more: Any) -> dict[str, Any]:
    """The least a policy of ``shape`` writes: what the family does not share."""
    data: dict[str, Any] = {
        "provider": "p",
        "shape": shape,
        "upstream": "https://api.example",
        "credential": {"header": "Authorization", "value": "Bearer ${DEMO_API_KEY}"},
        "routes": {"submit": {"path": "/v1/jobs"}, "status": {"path": "/v1/jobs/{job_id}"}},
        "states": {"pending": ["queued"], "success": ["done"]},
    }
    if shape in ("google-operation", "google-job"):
        data["routes"] = {"submit": {"path": "/v1/{parent}/jobs"}}
        data["states"] = {}
    if shape == "aws-job":
        data["credential"] = {"aws_sigv4": {"service": "bedrock", "region": "us-east-1"}}
        data["routes"]["submit"]["job_id"] = {"from": "body", "path": "jobArn"}
    if shape == "queue":
        data["routes"]["submit"]["job_id"] = {"from": "body", "path": "request_id"}
    return merge_under(data, more)


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        (
            "openai-job",
            {
                "routes.submit.job_id": {"from": "body", "path": "id", "name": None},
                "states.field": "status",
                "polling.early_calls": "replay",
                "answers.poll_after_ms_header": "openai-poll-after-ms",
            },
        ),
        (
            "google-operation",
            {
                "routes.submit.job_id": {"from": "body", "path": "name", "name": None},
                "routes.status.path": "/v1/{job_id*}",
                "routes.cancel.path": "/v1/{job_id*}:cancel",
                "states.field": "done",
                "states.pending": [False, None],
                "states.success": [True],
                "states.failure_if_present": ["error"],
                "states.success_requires": ["response"],
                "polling.early_calls": "replay",
            },
        ),
        (
            "google-job",
            {
                "routes.status.method": "GET",
                "routes.status.path": "/v1/{job_id*}",
                "states.field": "state",
                "states.failure": ["JOB_STATE_FAILED"],
                "states.cancelled": ["JOB_STATE_CANCELLED"],
                "states.expired": ["JOB_STATE_EXPIRED"],
                "states.success": ["JOB_STATE_SUCCEEDED", "JOB_STATE_PARTIALLY_SUCCEEDED"],
            },
        ),
        (
            "aws-job",
            {
                "credential.aws_sigv4.access_key_id": ENV["AWS_ACCESS_KEY_ID"],
                "credential.aws_sigv4.service": "bedrock",
                "routes.job_ids": "aws-arn",
                "states.field": "status",
                "polling.early_calls": "replay",
            },
        ),
        (
            "queue",
            {
                "routes.submit.status_url_fields": [
                    "status_url",
                    "response_url",
                    "cancel_url",
                    "urls.get",
                    "urls.cancel",
                ],
                "states.field": "status",
                "polling.early_calls": "replay",
            },
        ),
    ],
)
def test_a_shape_fills_its_familys_defaults(
    tmp_path: Path, shape: str, expected: dict[str, Any]
) -> None:
    """A policy that writes only what its family does not share takes the shape's job id
    source, state table, routes, credential placement and pacing from the shape."""
    policy = load(tmp_path, minimal(shape))
    dumped = policy.model_dump(mode="python", by_alias=True)
    for dotted, value in expected.items():
        node: Any = dumped
        for part in dotted.split("."):
            node = node[part]
        assert node == value, dotted
    pending = policy.states.pending
    if shape == "google-job":
        assert "JOB_STATE_PAUSED" in pending and "JOB_STATE_UPDATING" in pending


def test_whatever_the_file_writes_wins(tmp_path: Path) -> None:
    """Scalars and lists the file writes replace the shape's, mappings merge key by key,
    a job id source is replaced whole (no ``path`` from the shape beside ``from:
    location``), and ``null`` removes a route the shape fills."""
    policy = load(
        tmp_path,
        minimal(
            "google-job",
            routes={
                "submit": {"job_id": {"from": "location"}},
                "status": {"path": "/v1beta/{job_id*}"},
                "cancel": None,
            },
            states={"field": "metadata.state", "expired": []},
            polling={"early_calls": "hold"},
        ),
    )
    assert policy.routes.submit.job_id.source == "location"
    assert policy.routes.submit.job_id.path is None
    assert (policy.routes.status.method, policy.routes.status.path) == ("GET", "/v1beta/{job_id*}")
    assert policy.routes.cancel is None
    assert policy.states.field == "metadata.state"
    assert policy.states.expired == [] and policy.states.failure == ["JOB_STATE_FAILED"]
    assert policy.polling.early_calls == "hold"


def test_merging_leaves_the_table_and_the_file_as_they_were() -> None:
    """with_shape builds a new tree: neither the shapes' table nor the file's tree changes,
    so one policy's choices never leak into another's."""
    before = json.dumps({name: shape.fills for name, shape in SHAPES.items()}, sort_keys=True)
    raw = {"shape": "queue", "routes": {"submit": {"status_url_fields": ["x"]}}}
    merged = with_shape(raw)
    merged["routes"]["submit"]["status_url_fields"].append("y")
    merged["states"]["field"] = "changed"
    assert raw == {"shape": "queue", "routes": {"submit": {"status_url_fields": ["x"]}}}
    assert json.dumps({n: s.fills for n, s in SHAPES.items()}, sort_keys=True) == before
    assert with_shape({"shape": "nope"}) == {"shape": "nope"}


def test_an_unknown_shape_is_a_check_problem_naming_the_field(tmp_path: Path) -> None:
    """``shape`` must be one of the five names; check says so on the shape field."""
    with pytest.raises(ConfigError) as raised:
        load(tmp_path, {**minimal("openai-job"), "shape": "openai-jobs"})
    assert any(
        re.match(r"p\.yaml: shape: .*'openai-job'.*'queue'", line) for line in raised.value.problems
    ), raised.value.problems


def test_the_aws_job_credential_comes_from_the_standard_variables(tmp_path: Path) -> None:
    """aws-job fixes SigV4 with the keys in ${AWS_ACCESS_KEY_ID} and
    ${AWS_SECRET_ACCESS_KEY}; unset, check names the variable and the field."""
    with pytest.raises(ConfigError) as raised:
        load(tmp_path, minimal("aws-job"), env={"DEMO_API_KEY": "x-123456"})
    assert (
        "p.yaml: credential.aws_sigv4.access_key_id: environment variable AWS_ACCESS_KEY_ID "
        "is not set" in raised.value.problems
    )


# Differences a shape brings on purpose (SPEC 22): the openai SDK's pacing header.
INTENDED = {
    "openai-batch": {("answers", "poll_after_ms_header"): "openai-poll-after-ms"},
    "google-operations": {},
}


@pytest.mark.parametrize("name", sorted(INTENDED))
def test_shipped_policies_take_effect_as_before_their_shape(name: str) -> None:
    """Each shipped policy that now names a shape is shorter and validates to the policy
    its unshaped version did (the copy kept under tests/settings/data/unshaped), but for
    the differences the shape brings on purpose, listed here."""
    shaped = load_policy(ROOT / f"policies/{name}.yaml", name, ENV)
    before = load_policy(UNSHAPED / f"{name}.yaml", name, ENV)
    assert shaped.shape is not None and before.shape is None
    # the push and usage sections (SPEC 23) came after the shapes; push is off without its
    # secret, usage changes no rule
    now = shaped.model_dump(mode="json", by_alias=True, exclude={"shape", "push", "usage"})
    then = before.model_dump(mode="json", by_alias=True, exclude={"shape", "push", "usage"})
    for (section, key), value in INTENDED[name].items():
        assert now[section][key] == value and then[section][key] != value
        then[section][key] = value
    assert now == then
    text = (ROOT / f"policies/{name}.yaml").read_text().split("# OpenAI webhooks")[0]
    lines = len(text.splitlines())
    assert lines < len((UNSHAPED / f"{name}.yaml").read_text().splitlines())
    assert shaped.fingerprint == before.fingerprint  # the shape is not a rule of its own


def test_policies_that_use_nothing_new_keep_their_fingerprints() -> None:
    """Records remember the fingerprint of the policy they started under (resume compares
    it); the fields added for SPEC 22, left unset, leave it as it was (these values are the
    ones computed before those fields existed), and so does ``routes.cancel.by`` left at
    ``operator``: the policies that now let agents cancel had these fingerprints with it,
    and so did those now naming their provider's own upstream, with the demo's, and those
    now reading their provider's own key variable (the credential is no rule)."""
    before = {
        "anthropic-batches": "fa7e7f0f2af23cb2",
        "aws-transcribe": "d87d3d11137f0fd0",
        "azure-read": "ac0eddeb272a9599",
        "celery-flower": "e63eb5719b7dce6b",
        "demo-jobs": "c51020d1af4ba06d",
        "google-operations": "e34326af0451cc01",
    }
    for name, fingerprint in before.items():
        policy = load_policy(ROOT / f"policies/{name}.yaml", name, ENV)
        # these were computed when the files named the demo provider as their upstream;
        # they now name the provider's own (a change of rule: records say so at resume)
        policy = policy.model_copy(update={"upstream": "http://127.0.0.1:8081"})
        cancel = policy.routes.cancel
        if cancel is not None and cancel.by == "agent":  # SPEC 20a: a rule that changed
            operator = cancel.model_copy(update={"by": "operator"})
            routes = policy.routes.model_copy(update={"cancel": operator})
            assert policy.fingerprint != fingerprint
            policy = policy.model_copy(update={"routes": routes})
        assert policy.fingerprint == fingerprint, name


# -- statusgate policy show --------------------------------------------------------------------


def statusgate(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.run", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=60,
        check=False,
    )


def test_policy_show_prints_the_effective_policy_check_reads_back(tmp_path: Path) -> None:
    """``policy show`` prints the merged, validated policy with every default; written as
    a policy file it is the same policy; secrets appear as their ${...} source, never as
    their value."""
    config = ROOT / "config/gateway.yaml"
    sources = {
        "openai-batch": "${OPENAI_API_KEY}",
        "google-operations": "${GEMINI_API_KEY}",
        "demo-jobs": "${DEMO_API_KEY}",
    }
    for name, source in sources.items():
        done = statusgate("policy", "show", "--config", str(config), name, env=ENV)
        assert done.returncode == 0, done.stderr
        assert ENV["DEMO_API_KEY"] not in done.stdout + done.stderr
        shown = yaml.safe_load(done.stdout)
        assert source in shown["credential"]["value"]
        assert shown["polling"]["base_delay"].endswith(("s", "m", "h", "d"))
        written = tmp_path / f"{name}.yaml"
        written.write_text(done.stdout)
        again = load_policy(written, name, ENV)
        # the effective policy: the config's upstreams redirect (to the demo) applied
        assert again == load_settings(config, env=ENV).policies[name]
        assert again.upstream == f"http://127.0.0.1:8081/{name}"
    missing = statusgate("policy", "show", "--config", str(config), "nope", env=ENV)
    assert missing.returncode == 1 and "no policy for 'nope'" in missing.stderr


def test_policy_show_redacts_a_secret_written_literally(tmp_path: Path) -> None:
    """A credential written into the file itself (not from ${...}) is shown as
    <redacted>; the aws-job shape's own ${AWS_...} sources are shown as written."""
    folder = tmp_path / "policies"
    folder.mkdir()
    literal = minimal("openai-job", credential={"value": "Bearer sk-literal-secret-1"})
    (folder / "p.yaml").write_text(yaml.safe_dump(literal))
    (folder / "a.yaml").write_text(yaml.safe_dump({**minimal("aws-job"), "provider": "a"}))
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({"store": "memory://", "policies_dir": "policies"}))
    done = statusgate("policy", "show", "--config", str(config), "p", env=ENV)
    assert done.returncode == 0, done.stderr
    assert "sk-literal-secret-1" not in done.stdout
    assert yaml.safe_load(done.stdout)["credential"]["value"] == "<redacted>"
    aws = statusgate("policy", "show", "--config", str(config), "a", env=ENV)
    signing = yaml.safe_load(aws.stdout)["credential"]["aws_sigv4"]
    assert signing["access_key_id"] == "${AWS_ACCESS_KEY_ID}"
    assert signing["secret_access_key"] == "${AWS_SECRET_ACCESS_KEY}"
    assert ENV["AWS_SECRET_ACCESS_KEY"] not in aws.stdout


def test_the_policy_schema_names_the_shapes_and_accepts_shaped_files() -> None:
    """``statusgate schema policy`` lists the shapes, and a shaped file that leaves out what
    its shape fills is valid for editors (check still requires the effective fields)."""
    import jsonschema

    done = statusgate("schema", "policy", env=ENV)
    document = json.loads(done.stdout)
    shape = document["properties"]["shape"]
    assert sorted(shape["anyOf"][0]["enum"]) == sorted(SHAPES)
    validator = jsonschema.Draft202012Validator(document)
    for name in SHAPES:
        assert list(validator.iter_errors(minimal(name))) == [], name


DOC_EXAMPLE = re.compile(r"<!-- from-scratch -->\n```yaml\n(.*?)```", re.S)


def test_the_from_scratch_example_in_the_docs_is_a_whole_policy(tmp_path: Path) -> None:
    """docs/policies.md writes a provider of a known shape from scratch in under 20 lines;
    that text is a valid policy that check passes without a warning."""
    from gateway.settings.lints import check_warnings

    found = DOC_EXAMPLE.search((ROOT / "docs/policies.md").read_text())
    assert found is not None
    text = found.group(1)
    assert len(text.splitlines()) < 20
    path = tmp_path / "example.yaml"
    path.write_text(text)
    policy = load_policy(path, "example.yaml", {**ENV, "OPENAI_API_KEY": "sk-example-123"})
    assert check_warnings(policy) == []

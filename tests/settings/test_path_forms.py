"""SPEC 22, Paths: ``also`` path forms and ``routes.job_ids: aws-arn`` are checked with the
rest of a policy, each problem one ``file: field: message`` line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway import ConfigError
from gateway.settings.policy import load_policy

from conftest import merge

BASE: dict[str, Any] = {
    "provider": "p",
    "upstream": "https://api.example",
    "credential": {"header": "Authorization", "value": "Bearer k-123456"},
    "routes": {
        "submit": {"path": "/v1/jobs", "job_id": {"from": "body", "path": "id"}},
        "status": {"path": "/v1/jobs/{job_id}"},
        "cancel": {"method": "POST", "path": "/v1/jobs/{job_id}/cancel"},
    },
    "states": {"field": "state", "pending": ["queued"], "success": ["done"], "failure": []},
}


def problems(tmp_path: Path, change: dict[str, Any]) -> list[str]:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(merge(BASE, change)))
    try:
        load_policy(path, "p.yaml", {})
    except ConfigError as exc:
        return exc.problems
    return []


@pytest.mark.parametrize(
    ("change", "line"),
    [
        (
            {"routes": {"status": {"also": ["/v1beta/jobs/{id}"]}}},
            "p.yaml: routes.status.also[0]: must name the same placeholders as routes.status.path",
        ),
        (
            {"routes": {"status": {"also": ["/v1beta/jobs/{job_id}?x=1"]}}},
            "p.yaml: routes.status.also[0]: takes no query: the provider is sent the route's path",
        ),
        (
            {"routes": {"status": {"also": ["/v1/jobs/{job_id}"]}}},
            "p.yaml: routes.status.also[0]: repeats a path this route is already served at",
        ),
        (
            {"routes": {"submit": {"also": ["/v1/jobs/{x}/cancel"]}}},
            "p.yaml: routes.submit.also[0]: must name the same placeholders as routes.submit.path",
        ),
        (
            {
                "routes": {
                    "passthrough": [{"method": "POST", "path": "/v1/files", "also": ["/v1/jobs"]}]
                }
            },
            "p.yaml: routes.passthrough[0].also[0]: matches the same requests as "
            "routes.submit.path",
        ),
        (
            {"routes": {"job_ids": "aws-arn", "status": {"path": "/v1/{job_id*}"}, "cancel": None}},
            "p.yaml: routes.status.path: aws-arn job ids take {job_id}, not {job_id*}",
        ),
        (
            {"routes": {"job_ids": "arn"}},
            "p.yaml: routes.job_ids: input should be 'plain' or 'aws-arn'",
        ),
    ],
)
def test_path_form_problems_name_the_field(
    tmp_path: Path, change: dict[str, Any], line: str
) -> None:
    """Each invalid path form or job id form is one line naming its field."""
    assert line in problems(tmp_path, change)


def test_valid_forms_pass(tmp_path: Path) -> None:
    """Forms with the same placeholders under another version prefix, on every kind of
    route, are valid."""
    change = {
        "routes": {
            "submit": {"also": ["/v1beta/jobs"]},
            "status": {"also": ["/v1beta/jobs/{job_id}", "/v2/jobs/{job_id}"]},
            "cancel": {"also": ["/v1beta/jobs/{job_id}/cancel"]},
            "passthrough": [{"method": "POST", "path": "/v1/files", "also": ["/v1beta/files"]}],
            "job_ids": "aws-arn",
        }
    }
    assert problems(tmp_path, change) == []

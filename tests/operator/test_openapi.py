"""GET /openapi.json: an OpenAPI 3.1 document of the gateway's own surface, served open and
written from the models; Schemathesis checks the operator API of a real gateway process
against it (no server error, no answer the document does not allow)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from openapi_spec_validator import validate
from schemathesis import Case, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from gateway.core.models import Outcome, Reason
from gateway.core.problems import PROBLEMS

from conftest import (
    AGENT_TOKEN,
    OPERATOR_TOKEN,
    PROVIDER_ENV,
    ROOT,
    Harness,
    Served,
    fast_polling,
    free_port,
    start_statusgate,
    wait_until_up,
)

OPERATOR = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
AGENT = {"Authorization": f"Bearer {AGENT_TOKEN}"}
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]
AGENT_HEADERS = {
    "Statusgate-Operation",
    "Statusgate-Outcome",
    "Statusgate-Provider-State",
    "Statusgate-Requests-Remaining",
    "Statusgate-Deadline",
    "Statusgate-Next-Poll-At",
    "Retry-After",
    "Retry-After-Ms",
    "X-Should-Retry",
    "X-Request-Id",
}


def validator(document: dict[str, Any], name: str) -> jsonschema.Draft202012Validator:
    """A validator for one component schema of the document, its references resolved."""
    return jsonschema.Draft202012Validator({**document, "$ref": f"#/components/schemas/{name}"})


async def test_document_is_open_and_valid_openapi_31(harness: Harness) -> None:
    """Served without a token; valid OpenAPI 3.1; every problem slug, outcome and reason is
    an enum value; the headers agents see, the security schemes and paging are described."""
    response = await harness.client.get("/openapi.json")
    assert response.status == 200
    document = await response.json()
    validate(document)
    assert document["openapi"].startswith("3.1")
    schemas = document["components"]["schemas"]
    types = set(schemas["Problem"]["properties"]["type"]["enum"])
    assert types == {f"/problems/{slug}" for slug in PROBLEMS}
    assert schemas["Outcome"]["enum"] == [o.value for o in Outcome]
    assert schemas["Reason"]["enum"] == [r.value for r in Reason]
    assert set(document["components"]["headers"]) >= AGENT_HEADERS
    assert set(document["components"]["securitySchemes"]) >= {"operatorBearer", "agentBearer"}
    listing = document["paths"]["/admin/operations"]["get"]
    assert {"limit", "cursor"} <= {p["name"] for p in listing["parameters"]}
    assert "next_cursor" in schemas["OperationList"]["properties"]
    for path in ("/healthz", "/readyz", "/metrics", "/problems/{slug}", "/admin/reload"):
        assert path in document["paths"]


async def test_real_answers_match_the_schemas(harness: Harness) -> None:
    """The operator API's answers about pending, succeeded and escalated operations, and a
    problem, validate against the document's schemas."""
    done = await harness.submit([{"state": "succeeded"}], key="a")
    stuck = await harness.submit([{"state": "bogus"}], key="b")
    await harness.submit([{"state": "running"}], key="c")
    harness.clock.advance(5)
    for answer in (done, stuck):
        await harness.poll((await answer.json())["id"])
    document = await (await harness.client.get("/openapi.json")).json()
    listed = await (await harness.client.get("/admin/operations", headers=OPERATOR)).json()
    validator(document, "OperationList").validate(listed)
    outcomes = {o["outcome"] for o in listed["operations"]}
    assert outcomes == {"pending", "succeeded", "escalated"}
    for record in listed["operations"]:
        url = f"/admin/operations/{record['operation_id']}"
        shown = await (await harness.client.get(url, headers=OPERATOR)).json()
        validator(document, "OperationDetail").validate(shown)
    refused = await harness.client.get("/admin/operations", headers=AGENT)
    assert refused.status == 403
    validator(document, "Problem").validate(await refused.json())


# -- Schemathesis against a real gateway process ---------------------------------------------


@pytest.fixture(scope="module")
def operator_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A `statusgate serve` process in front of a `statusgate demo-provider` process, with a
    pending, a succeeded and an escalated operation; its document's operator operations."""
    folder: Path = tmp_path_factory.mktemp("openapi")
    port = free_port()
    env = {**os.environ, **PROVIDER_ENV}
    provider = start_statusgate(["demo-provider", "--port", str(port)], env)
    wait_until_up(port, provider)
    served = Served(
        folder,
        f"http://127.0.0.1:{port}",
        folder / "g.db",
        policy_changes={"demo-jobs": {"polling": fast_polling()}},
        config={"logging": {"level": "warning"}},  # the unread stderr pipe never fills
    )
    wait_until_up(served.port, served.start())
    base = f"http://127.0.0.1:{served.port}"
    try:
        _operations(base)
        yield schemathesis.openapi.from_url(f"{base}/openapi.json").include(tag="operator")
    finally:
        stderr = served.stop()
        provider.terminate()
        provider.communicate(timeout=10)
        assert "Traceback" not in stderr, stderr


def _operations(base: str) -> None:
    """A pending, a succeeded and an escalated operation (each polled once)."""
    jobs = []
    for key, state in (("p", "running"), ("s", "succeeded"), ("e", "bogus")):
        answer = requests.post(
            f"{base}/p/demo-jobs/v1/jobs",
            json={"input": "x", "demo_script": [{"state": state}]},
            headers={**AGENT, "Idempotency-Key": key},
            timeout=10,
        )
        assert answer.status_code == 202, answer.text
        jobs.append(answer.json()["id"])
    for job in jobs:
        url = f"{base}/p/demo-jobs/v1/jobs/{job}"
        requests.get(url, headers={**AGENT, "Prefer": "wait=5"}, timeout=10)


OPERATOR_OPERATIONS = [
    ("GET", "/admin/me"),
    ("GET", "/admin/operations"),
    ("GET", "/admin/escalations"),
    ("GET", "/admin/operations/{operation_id}"),
    ("POST", "/admin/operations/{operation_id}/{action}"),
    ("POST", "/admin/reload"),
    ("GET", "/admin/keys"),
    ("POST", "/admin/keys"),
    ("DELETE", "/admin/keys/{key_id}"),
    ("POST", "/admin/keys/{key_id}/rotate"),
]


def test_the_documented_command_runs_the_checks_the_suite_runs() -> None:
    """docs/mcp.md's `schemathesis run` names the checks this suite holds the gateway to:
    without them Schemathesis runs all its checks, some of which the document does not
    promise (unsupported_method, positive_data_acceptance), and the pasted command fails."""
    text = (ROOT / "docs" / "mcp.md").read_text()
    command = text.split("```sh\nschemathesis run ", 1)[1].split("```", 1)[0]
    named = command.split("--checks ", 1)[1].split()[0].split(",") if "--checks " in command else []
    assert sorted(named) == sorted(check.__name__ for check in CHECKS), command


def test_every_operator_operation_is_exercised(operator_api: Any) -> None:
    """The generated tests below cover every operation the document tags operator."""
    found = {(r.ok().method.upper(), r.ok().path) for r in operator_api.get_all_operations()}
    assert found == set(OPERATOR_OPERATIONS)


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
@pytest.mark.parametrize(("method", "path"), OPERATOR_OPERATIONS)
def test_operator_api_answers_as_documented(
    operator_api: Any, method: str, path: str, mode: GenerationMode
) -> None:
    """Generated calls (valid and invalid input) to one operator operation, with an operator
    token: no 5xx, and status codes, content types, bodies and headers as documented."""
    operation = operator_api[path][method]

    @given(case=operation.as_strategy(mode))
    @settings(
        max_examples=20,
        deadline=None,
        database=None,
        derandomize=True,  # the same calls every run: a failure here is never a fluke
        suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.generate],
    )
    def run(case: Case) -> None:
        statuses.append(
            case.call_and_validate(headers=OPERATOR, checks=CHECKS, timeout=10).status_code
        )

    statuses: list[int] = []
    run()
    assert statuses  # the generated calls did go out


def test_decisions_on_real_operations_answer_as_documented(operator_api: Any) -> None:
    """Real operations shown, and decisions on the escalated one (resume refused, abandon,
    extend refused once abandoned), answer as documented under Schemathesis's checks."""
    base = str(operator_api.location).removesuffix("/openapi.json")
    listed = requests.get(f"{base}/admin/operations", headers=OPERATOR, timeout=10)
    records = {r["outcome"]: r["operation_id"] for r in listed.json()["operations"]}
    assert set(records) == {"pending", "succeeded", "escalated"}
    show = operator_api["/admin/operations/{operation_id}"]["GET"]
    for operation_id in records.values():
        case = show.Case(path_parameters={"operation_id": operation_id}, headers=OPERATOR)
        case.call_and_validate(checks=CHECKS, timeout=10)
    act = operator_api["/admin/operations/{operation_id}/{action}"]["POST"]
    for action, body, status in (
        ("resume", {"reason": "not yet"}, 409),
        ("abandon", {"reason": "test over"}, 200),
        ("extend", {"time": "1m", "requests": 1}, 409),
    ):
        path = {"operation_id": records["escalated"], "action": action}
        case = act.Case(
            path_parameters=path, headers=OPERATOR, body=body, media_type="application/json"
        )
        response = case.call_and_validate(checks=CHECKS, timeout=10)
        assert response.status_code == status, response.text

"""The policy language of SPEC section 12: job ids of several segments, routes matched on
headers, status calls by POST, JSON scalar states, credentials of four kinds and where
agents may put their token. Real gateways in front of real aiohttp providers."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from gateway import ConfigError
from gateway.core import decide
from gateway.core.models import ProviderAnswer
from gateway.core.routing import RouteTable
from gateway.flow.runtime import RUNTIME
from gateway.run.app import create_app
from gateway.settings.config import load_settings
from gateway.settings.policy import load_policy

from conftest import AGENT_TOKEN, FakeClock, sha

NOW = 1_800_000_000.0
CLIENT_SECRET = "client-secret-9f8e7d6c"
AWS_SECRET = "aws-secret-key-5a4b3c2d1e"
AWS_KEY_ID = "AKIAGATEWAYKEY000001"


def write(folder: Path, policy: dict[str, Any]) -> Path:
    """A config folder holding one policy and the usual accounts."""
    (folder / "policies").mkdir(parents=True, exist_ok=True)
    (folder / "policies" / "p.yaml").write_text(yaml.safe_dump(policy))
    config = {
        "public_base_url": "http://gateway.test",
        "store": "memory://",
        "policies_dir": "policies",
        "accounts": [{"id": "team-a", "token_sha256": [sha(AGENT_TOKEN)]}],
        "audit": {"path": "audit.jsonl"},
    }
    (folder / "gateway.yaml").write_text(yaml.safe_dump(config))
    return folder / "gateway.yaml"


def base_policy(upstream: str, **changes: Any) -> dict[str, Any]:
    policy: dict[str, Any] = {
        "provider": "p",
        "upstream": upstream,
        "credential": {"header": "Authorization", "value": "Bearer provider-key-123"},
        "routes": {
            "submit": {
                "method": "POST",
                "path": "/v1/jobs",
                "job_id": {"from": "body", "path": "name"},
            },
            "status": {"method": "GET", "path": "/v1/{job_id*}"},
        },
        "states": {"field": "done", "pending": [False, None], "success": [True]},
        "polling": {"base_delay": "1s", "jitter": {"min": 1.0, "max": 1.0}},
    }
    policy.update(changes)
    return policy


class Provider:
    """A real aiohttp provider whose answers the test scripts; every request is kept."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.answers: dict[str, Callable[[web.Request, bytes], web.Response]] = {}

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.seen.append(
            {
                "method": request.method,
                "path": request.path_qs,
                "headers": dict(request.headers),
                "body": body,
                "url": str(request.url),
            }
        )
        for prefix, answer in self.answers.items():
            if request.path.startswith(prefix):
                return answer(request, body)
        return web.json_response({"error": "unscripted"}, status=500)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app


@pytest.fixture
async def provider() -> AsyncIterator[tuple[Provider, str]]:
    fake = Provider()
    server = TestServer(fake.app(), host="127.0.0.1")
    await server.start_server()
    yield fake, str(server.make_url("")).rstrip("/")
    await server.close()


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    clients: list[TestClient[Any, Any]] = []

    async def start(policy: dict[str, Any], clock: FakeClock | None = None) -> TestClient[Any, Any]:
        settings = load_settings(write(tmp_path / f"g{len(clients)}", policy), env={})
        clock = clock or FakeClock(NOW)
        app = create_app(settings, clock=clock, sleep=clock.sleep)
        client: TestClient[Any, Any] = TestClient(TestServer(app, host="127.0.0.1"))
        await client.start_server()
        clients.append(client)
        return client

    yield start
    for client in clients:
        await client.close()


AUTH = {"Authorization": f"Bearer {AGENT_TOKEN}"}


# -- job ids of several segments -------------------------------------------------------------


async def test_resource_name_job_ids_round_trip(
    provider: tuple[Provider, str], gateway: Callable[..., Any]
) -> None:
    """``{job_id*}``: a Google-style operation name is tracked and polled as one job id,
    ``done: false`` is pending (a boolean state) and ``done: true`` success."""
    fake, upstream = provider
    name = "projects/p1/locations/eu/operations/7"
    fake.answers["/v1/jobs"] = lambda r, b: web.json_response({"name": name, "done": False})
    answers = iter([{"name": name}, {"name": name, "done": True, "response": {}}])
    fake.answers["/v1/projects"] = lambda r, b: web.json_response(next(answers))
    clock = FakeClock(NOW)
    client = await gateway(base_policy(upstream), clock)
    submitted = await client.post("/p/p/v1/jobs", json={}, headers=AUTH)
    assert submitted.status == 200, await submitted.text()
    assert submitted.headers["Location"] == f"http://gateway.test/p/p/v1/{name}"
    clock.advance(1.0)
    first = await client.get(f"/p/p/v1/{name}", headers=AUTH)
    assert (first.status, first.headers["Statusgate-Outcome"]) == (200, "pending")
    clock.advance(2.0)
    done = await client.get(f"/p/p/v1/{name}", headers=AUTH)
    assert done.headers["Statusgate-Outcome"] == "succeeded"
    assert done.headers["Statusgate-Provider-State"] == "true"
    assert [s["path"] for s in fake.seen[1:]] == [f"/v1/{name}"] * 2


@pytest.mark.parametrize(
    "path",
    [
        "/p/p/v1/projects/../secrets",
        "/p/p/v1/projects//operations",
        "/p/p/v1/projects/%2F/operations",
        "/p/p/v1/a/b/c/d/e/f/g/h/i",
        "/p/p/v1/projects/./x",
    ],
)
async def test_bad_resource_names_never_reach_the_provider(
    provider: tuple[Provider, str], gateway: Callable[..., Any], path: str
) -> None:
    """Each segment of a ``{job_id*}`` is checked: no empty, dot or dot-dot segment, no
    encoded slash, at most 8 segments."""
    fake, upstream = provider
    client = await gateway(base_policy(upstream))
    answer = await client.get(path, headers=AUTH)
    assert answer.status in (400, 404)
    assert fake.seen == []


# -- routes matched on headers, status by POST ----------------------------------------------


def aws_policy(upstream: str) -> dict[str, Any]:
    target = "X-Amz-Target"
    return base_policy(
        upstream,
        credential={
            "aws_sigv4": {
                "service": "transcribe",
                "region": "us-east-1",
                "access_key_id": AWS_KEY_ID,
                "secret_access_key": AWS_SECRET,
            }
        },
        routes={
            "submit": {
                "method": "POST",
                "path": "/",
                "match": {"headers": {target: "Transcribe.StartTranscriptionJob"}},
                "job_id": {"from": "request", "path": "TranscriptionJobName"},
                "idempotency": {"from_body": "ClientRequestToken"},
            },
            "status": {
                "method": "POST",
                "path": "/",
                "match": {"headers": {target: "Transcribe.GetTranscriptionJob"}},
                "job_id": {"from": "request", "path": "TranscriptionJobName"},
            },
        },
        states={
            "field": "TranscriptionJob.TranscriptionJobStatus",
            "pending": ["QUEUED", "IN_PROGRESS"],
            "success": ["COMPLETED"],
            "failure": ["FAILED"],
        },
    )


def aws_answer(request: web.Request, body: bytes) -> web.Response:
    target = request.headers.get("X-Amz-Target", "")
    name = json.loads(body)["TranscriptionJobName"]
    status = "QUEUED" if target.endswith("StartTranscriptionJob") else "COMPLETED"
    job = {"TranscriptionJobName": name, "TranscriptionJobStatus": status}
    return web.json_response({"TranscriptionJob": job})


def signature_is_valid(seen: dict[str, Any]) -> bool:
    """Recompute the SigV4 signature over what the provider received."""
    authorization = seen["headers"]["Authorization"]
    signed = authorization.split("SignedHeaders=")[1].split(",")[0].split(";")
    headers = {k: v for k, v in seen["headers"].items() if k.lower() in signed}
    request = AWSRequest(method="POST", url=seen["url"], data=seen["body"], headers=headers)
    request.context["timestamp"] = seen["headers"]["X-Amz-Date"]
    signer = SigV4Auth(Credentials(AWS_KEY_ID, AWS_SECRET), "transcribe", "us-east-1")
    canonical = signer.canonical_request(request)
    expected = signer.signature(signer.string_to_sign(request, canonical), request)
    return bool(seen["headers"]["Authorization"].endswith(f"Signature={expected}"))


async def test_json_rpc_over_post_signed_with_sigv4(
    provider: tuple[Provider, str], gateway: Callable[..., Any]
) -> None:
    """AWS-style: submit and status share POST /, told apart by X-Amz-Target; the job id
    comes from the agent's body; the agent signs with its gateway token as access key id;
    the provider gets the gateway's key with a valid signature, never the agent's."""
    fake, upstream = provider
    fake.answers["/"] = aws_answer
    clock = FakeClock(NOW)
    client = await gateway(aws_policy(upstream), clock)
    agent_sig = (
        f"AWS4-HMAC-SHA256 Credential={AGENT_TOKEN}/20261130/us-east-1/transcribe/aws4_request, "
        "SignedHeaders=host;x-amz-date, Signature=00"
    )
    headers = {
        "Authorization": agent_sig,
        "X-Amz-Date": "20261130T000000Z",
        "X-Amz-Security-Token": "agent-session",
        "Content-Type": "application/x-amz-json-1.1",
    }
    start = {"TranscriptionJobName": "job-1", "ClientRequestToken": "tok-1", "Media": {}}
    submitted = await client.post(
        "/p/p/",
        data=json.dumps(start),
        headers={**headers, "X-Amz-Target": "Transcribe.StartTranscriptionJob"},
    )
    assert submitted.status == 200, await submitted.text()
    replay = await client.post(
        "/p/p/",
        data=json.dumps(start),
        headers={**headers, "X-Amz-Target": "Transcribe.StartTranscriptionJob"},
    )
    assert replay.headers["Statusgate-Operation"] == submitted.headers["Statusgate-Operation"]
    clock.advance(1.0)
    status = await client.post(
        "/p/p/",
        data=json.dumps({"TranscriptionJobName": "job-1"}),
        headers={**headers, "X-Amz-Target": "Transcribe.GetTranscriptionJob"},
    )
    assert status.status == 200, await status.text()
    assert status.headers["Statusgate-Outcome"] == "succeeded"
    assert len(fake.seen) == 2  # the replay was answered by the gateway
    for seen in fake.seen:
        authorization = seen["headers"]["Authorization"]
        assert f"Credential={AWS_KEY_ID}/" in authorization and AGENT_TOKEN not in authorization
        assert "X-Amz-Security-Token" not in seen["headers"]
        assert signature_is_valid(seen)
    unknown = await client.post(
        "/p/p/",
        data=json.dumps({"TranscriptionJobName": "job-2"}),
        headers={**headers, "X-Amz-Target": "Transcribe.GetTranscriptionJob"},
    )
    assert unknown.status == 404
    other = await client.post("/p/p/", data=b"{}", headers={**headers, "X-Amz-Target": "X.Y"})
    assert other.status == 404 and len(fake.seen) == 2


# -- states of any JSON scalar -----------------------------------------------------------------


def test_states_compare_as_json_values(tmp_path: Path) -> None:
    """``false`` is not ``"false"``, 1 is 1.0, null is an absent field; a success carrying
    a ``failure_if_present`` field is a failure."""
    path = tmp_path / "p.yaml"
    path.write_text(
        yaml.safe_dump(
            base_policy(
                "http://x.test",
                states={
                    "field": "done",
                    "pending": [False, None, 0],
                    "success": [True],
                    "failure_if_present": ["error"],
                },
            )
        )
    )
    policy = load_policy(path, "p.yaml", {})
    assert policy.state_class(False) == "pending"
    assert policy.state_class("false") is None
    assert policy.state_class(0.0) == "pending"
    assert policy.state_class(None) == "pending"
    record = decide.open_operation(
        policy,
        operation_id="op",
        account="a",
        job_id="operations/1",
        fingerprint="f",
        idempotency_key=None,
        answer=ProviderAnswer(200, b"{}"),
        now=NOW,
        u=1.0,
    ).record
    failed = decide.classify(
        policy, record, ProviderAnswer(200, b'{"done": true, "error": {"code": 3}}'), NOW, 1.0
    )
    assert failed.record.outcome.value == "failed"
    absent = decide.classify(policy, record, ProviderAnswer(200, b"{}"), NOW, 1.0)
    assert absent.record.outcome.value == "pending"
    text = decide.classify(policy, record, ProviderAnswer(200, b'{"done": "false"}'), NOW, 1.0)
    assert text.record.escalation is not None
    assert text.record.escalation.reason.value == "unknown_state"


# -- credentials -----------------------------------------------------------------------------


async def test_query_credentials_cannot_be_set_by_the_agent(
    provider: tuple[Provider, str], gateway: Callable[..., Any]
) -> None:
    """The credential's query parameter is always the gateway's, whatever the agent sends."""
    fake, upstream = provider
    fake.answers["/v1/jobs"] = lambda r, b: web.json_response({"name": "operations/1"})
    policy = base_policy(upstream, credential={"query": "key", "value": "google-api-key-1"})
    policy["routes"]["status"]["query_params"] = ["key", "view"]
    clock = FakeClock(NOW)
    client = await gateway(policy, clock)
    await client.post("/p/p/v1/jobs?key=agent-chosen", json={}, headers=AUTH)
    clock.advance(1.0)
    fake.answers["/v1/operations"] = lambda r, b: web.json_response({"done": False})
    await client.get("/p/p/v1/operations/1?key=evil&view=full", headers=AUTH)
    submit, status = fake.seen
    assert submit["path"] == "/v1/jobs?key=google-api-key-1"
    assert status["path"] == "/v1/operations/1?view=full&key=google-api-key-1"
    assert "Authorization" not in status["headers"]


async def test_oauth2_tokens_are_fetched_cached_and_renewed_once_on_401(
    provider: tuple[Provider, str], gateway: Callable[..., Any]
) -> None:
    """Client credentials (RFC 6749 4.4): one token for many calls until shortly before it
    expires. A 401 to a submit renews it and sends once more (nothing was accepted); a 401 to
    a status call renews it for the next permitted poll, and counts as the one request it was
    (a transport failure), never as an uncounted second call."""
    fake, upstream = provider
    issued: list[str] = []

    def token(request: web.Request, body: bytes) -> web.Response:
        basic = request.headers["Authorization"].removeprefix("Basic ")
        assert base64.b64decode(basic).decode() == f"client-1:{CLIENT_SECRET}"
        assert b"grant_type=client_credentials" in body and b"scope=jobs" in body
        issued.append(f"token-{len(issued) + 1}")
        return web.json_response({"access_token": issued[-1], "expires_in": 600})

    refuse = {"token-1"}  # the submit's first token; the first poll's is added below

    def jobs(request: web.Request, body: bytes) -> web.Response:
        used = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if used in refuse:
            refuse.discard(used)
            return web.json_response({"error": "expired"}, status=401)
        return web.json_response({"name": "operations/1", "done": False})

    fake.answers["/oauth/token"] = token
    fake.answers["/v1/"] = jobs
    credential = {
        "oauth2_client_credentials": {
            "token_url": f"{upstream}/oauth/token",
            "client_id": "client-1",
            "client_secret": CLIENT_SECRET,
            "scope": "jobs",
        },
        "header": "Authorization",
    }
    clock = FakeClock(NOW)
    client = await gateway(base_policy(upstream, credential=credential), clock)
    submitted = await client.post("/p/p/v1/jobs", json={}, headers=AUTH)
    assert submitted.status == 200, await submitted.text()
    assert issued == ["token-1", "token-2"]  # the submit's 401 renewed it, sent once more
    refuse.add("token-2")
    runtime = client.app[RUNTIME]
    record = await runtime.store.find("team-a", "p", "operations/1")
    assert record is not None
    clock.now = record.next_poll_at
    refused = await client.get("/p/p/v1/operations/1", headers=AUTH)
    assert (refused.status, refused.headers["X-Should-Retry"]) == (503, "true")
    record = await runtime.store.find("team-a", "p", "operations/1")
    assert record is not None
    assert (record.status_requests_used, record.transport_failures_used) == (1, 1)
    clock.now = record.next_poll_at
    polled = await client.get("/p/p/v1/operations/1", headers=AUTH)
    assert polled.status == 200, await polled.text()
    assert issued == ["token-1", "token-2", "token-3"]  # renewed once per 401
    statuses = [s for s in fake.seen if s["path"].startswith("/v1/operations")]
    assert len(statuses) == 2  # every status request sent is a counted one
    record = await runtime.store.find("team-a", "p", "operations/1")
    assert record is not None
    clock.now = record.next_poll_at
    await client.get("/p/p/v1/operations/1", headers=AUTH)
    assert issued == ["token-1", "token-2", "token-3"]  # cached
    clock.advance(600)
    await client.get("/p/p/v1/operations/1", headers=AUTH)
    assert issued[-1] == "token-4"  # expired: fetched anew
    sent = [s for s in fake.seen if s["path"].startswith("/v1/")]
    assert sent[-1]["headers"]["Authorization"] == "Bearer token-4"


async def test_a_failing_token_endpoint_is_a_transport_failure(
    provider: tuple[Provider, str], gateway: Callable[..., Any]
) -> None:
    """A token endpoint that fails or answers junk: 503 provider-unavailable with
    Retry-After, counted as a transport failure; the client secret appears nowhere."""
    fake, upstream = provider
    fake.answers["/oauth/token"] = lambda r, b: web.Response(text="<html>oops</html>", status=200)
    credential = {
        "oauth2_client_credentials": {
            "token_url": f"{upstream}/oauth/token",
            "client_id": "client-1",
            "client_secret": CLIENT_SECRET,
        },
    }
    client = await gateway(base_policy(upstream, credential=credential))
    submitted = await client.post("/p/p/v1/jobs", json={}, headers=AUTH)
    assert submitted.status == 503
    assert submitted.headers["X-Should-Retry"] == "true" and "Retry-After" in submitted.headers
    text = await submitted.text()
    assert CLIENT_SECRET not in text
    assert [s["path"] for s in fake.seen] == ["/oauth/token"]  # the provider got nothing


# -- where agents put their token ----------------------------------------------------------


async def test_statusgate_token_header_authenticates_and_is_never_forwarded(
    provider: tuple[Provider, str], gateway: Callable[..., Any]
) -> None:
    """SDKs that own Authorization (x-api-key SDKs, SigV4 SDKs) send Statusgate-Token."""
    fake, upstream = provider
    fake.answers["/v1/jobs"] = lambda r, b: web.json_response({"name": "operations/1"})
    client = await gateway(base_policy(upstream))
    answer = await client.post(
        "/p/p/v1/jobs", json={}, headers={"Statusgate-Token": AGENT_TOKEN, "x-api-key": "sdk"}
    )
    assert answer.status == 200
    headers = fake.seen[0]["headers"]
    assert "Statusgate-Token" not in headers and AGENT_TOKEN not in json.dumps(headers)
    assert headers["Authorization"] == "Bearer provider-key-123"
    refused = await client.post("/p/p/v1/jobs", json={}, headers={"Statusgate-Token": "nope"})
    assert refused.status == 401


# -- check ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {
                "routes": {
                    "submit": {"path": "/v1/{job_id*}", "job_id": {"from": "body", "path": "n"}},
                    "status": {"path": "/v1/{job_id*}"},
                }
            },
            "routes.submit.path: {final.*} and {job_id*} are only for tracked routes",
        ),
        (
            {
                "routes": {
                    "submit": {"path": "/v1/jobs", "job_id": {"from": "body", "path": "n"}},
                    "status": {"method": "POST", "path": "/v1/get"},
                }
            },
            "routes.status.path: must contain {job_id} or {job_id*} exactly once, or the route "
            "must read the job id from the request body (job_id: {from: request, path: P})",
        ),
        (
            {
                "credential": {
                    "query": "key",
                    "value": "v",
                    "aws_sigv4": {
                        "service": "s",
                        "region": "r",
                        "access_key_id": "a",
                        "secret_access_key": "b",
                    },
                }
            },
            "credential: choose one kind of credential, not query and aws_sigv4",
        ),
        (
            {
                "routes": {
                    "submit": {"path": "/", "job_id": {"from": "request", "path": "n"}},
                    "status": {
                        "method": "POST",
                        "path": "/",
                        "job_id": {"from": "request", "path": "n"},
                    },
                }
            },
            "routes.status: matches the same requests as routes.submit; add a match",
        ),
        (
            {
                "routes": {
                    "submit": {"path": "/v1/jobs", "job_id": {"from": "header"}},
                    "status": {"path": "/v1/{job_id}"},
                }
            },
            "routes.submit.job_id.name: is required when from is header",
        ),
    ],
)
def test_incompatible_options_fail_check_naming_the_field(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    """A policy mixing options that cannot work together fails with file:field messages."""
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({**base_policy("http://x.test"), **change}))
    with pytest.raises(ConfigError) as failed:
        load_policy(path, "p.yaml", {})
    assert any(line.endswith(message) for line in failed.value.problems), failed.value.problems


def test_routes_on_one_path_are_told_apart_by_their_match_headers(tmp_path: Path) -> None:
    """Two routes on one method and path are chosen by their match headers; a request
    carrying neither header matches no route."""
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(aws_policy("http://x.test")))
    table = RouteTable(load_policy(path, "p.yaml", {}))
    start = table.match("POST", "/", {"X-Amz-Target": "Transcribe.StartTranscriptionJob"})
    get = table.match("POST", "/", {"X-Amz-Target": "Transcribe.GetTranscriptionJob"})
    assert start is not None and start.kind == "submit"
    assert get is not None and get.kind == "status"
    assert table.match("POST", "/", {}) is None


async def test_a_body_too_large_to_sign_is_413_and_never_sent(
    provider: tuple[Provider, str], gateway: Callable[..., Any]
) -> None:
    """SigV4 signs the exact body: one over max_request_body is refused 413 before any
    signing, and nothing is sent unsigned (or at all)."""
    fake, upstream = provider
    client = await gateway(aws_policy(upstream))
    big = json.dumps({"TranscriptionJobName": "job-big", "Media": "x" * (2 * 1024 * 1024)})
    answer = await client.post(
        "/p/p/",
        data=big,
        headers={
            "Statusgate-Token": AGENT_TOKEN,
            "X-Amz-Target": "Transcribe.StartTranscriptionJob",
        },
    )
    assert answer.status == 413
    assert fake.seen == []

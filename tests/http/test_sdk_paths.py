"""SPEC 22: paths as the SDKs send them. A route served at more than one path form
(``also``: google-genai's API versions), and job ids that are AWS ARNs, percent-encoded in
one segment as boto3 sends them (``routes.job_ids: aws-arn``, the aws-job shape): the ARN
and its trailing id reach the same operation, and nothing decoded becomes a path."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any
from urllib.parse import quote

import boto3
import pytest
from aiohttp.test_utils import TestClient, TestServer
from yarl import URL

from gateway.core.routing import RouteTable, fill
from gateway.settings.policy import ProviderPolicy

from conftest import AGENT_TOKEN, FakeClock
from doubles import Answer, Double, Seen, bearer, due, gateway, record_of, serve

ARN = "arn:aws:bedrock:us-east-1:123456789012:model-invocation-job/abc123def456"
ENCODED = quote(ARN, safe="")  # what botocore puts in the URI label


# -- several path forms for one route ----------------------------------------------------------


def vertex_policy(upstream: str) -> dict[str, Any]:
    jobs = "/projects/{project}/locations/{location}/batchPredictionJobs"
    return {
        "provider": "vertex-test",
        "shape": "google-job",
        "upstream": upstream,
        "credential": {"header": "Authorization", "value": "Bearer ${DEMO_API_KEY}"},
        "routes": {
            "submit": {"path": f"/v1{jobs}", "also": [f"/v1beta1{jobs}"]},
            "status": {"also": ["/v1beta1/{job_id*}"]},
            "cancel": {"also": ["/v1beta1/{job_id*}:cancel"]},
        },
        "polling": {"base_delay": "2s", "max_delay": "8s", "jitter": {"min": 1, "max": 1}},
    }


def vertex(seen: Seen) -> Answer:
    name = "projects/p1/locations/us-central1/batchPredictionJobs/42"
    state = "JOB_STATE_PENDING" if seen.method == "POST" else "JOB_STATE_RUNNING"
    return 200, {"name": name, "state": state}, {}


async def test_every_path_form_reaches_the_route_and_the_provider_gets_its_path(
    tmp_path: Path, clock: FakeClock
) -> None:
    """A submit and status calls at the ``also`` form (google-genai's v1beta1 on Vertex)
    and at the route's path reach one operation; the provider is always sent the route's
    own path; a form the policy does not declare is route-not-allowed."""
    double = Double(vertex)
    server = await serve(double)
    upstream = str(server.make_url("")).rstrip("/")
    client = await gateway(tmp_path, clock, upstream, {"vertex-test": vertex_policy(upstream)})
    name = "projects/p1/locations/us-central1/batchPredictionJobs/42"
    try:
        jobs = "/projects/p1/locations/us-central1/batchPredictionJobs"
        created = await client.post(f"/p/vertex-test/v1beta1{jobs}", json={}, headers=bearer())
        assert created.status == 200, await created.text()
        assert [s.path for s in double.log] == [f"/v1{jobs}"]
        operations = set()
        for version in ("v1beta1", "v1"):
            await due(client, clock, "vertex-test", name)
            answer = await client.get(f"/p/vertex-test/{version}/{name}", headers=bearer())
            assert answer.status == 200, await answer.text()
            operations.add(answer.headers["Statusgate-Operation"])
        assert len(operations) == 1
        assert [s.path for s in double.log[1:]] == [f"/v1/{name}", f"/v1/{name}"]
        other = await client.get(f"/p/vertex-test/v2/{name}", headers=bearer())
        assert other.status == 404
        assert (await other.json())["type"] == "/problems/route-not-allowed"
    finally:
        await client.close()
        await server.close()


# -- ARN job ids -------------------------------------------------------------------------------


def bedrock_policy(upstream: str) -> dict[str, Any]:
    return {
        "provider": "bedrock-test",
        "shape": "aws-job",
        "upstream": upstream,
        "credential": {
            "aws_sigv4": {
                "service": "bedrock",
                "region": "us-east-1",
                "access_key_id": "${DEMO_API_KEY}",
                "secret_access_key": "${DEMO_API_KEY}",
            }
        },
        "routes": {
            "submit": {
                "path": "/model-invocation-job",
                "job_id": {"from": "body", "path": "jobArn"},
            },
            "status": {"path": "/model-invocation-job/{job_id}"},
            "cancel": {"method": "POST", "path": "/model-invocation-job/{job_id}/stop"},
        },
        "states": {
            "pending": ["Submitted", "Validating", "Scheduled", "InProgress", "Stopping"],
            "success": ["Completed", "PartiallyCompleted"],
            "failure": ["Failed"],
            "cancelled": ["Stopped"],
            "expired": ["Expired"],
        },
        "polling": {"base_delay": "5s", "max_delay": "20s", "jitter": {"min": 1, "max": 1}},
    }


class Bedrock:
    """GetModelInvocationJob answers only for the ARN as botocore encodes it."""

    def __init__(self, done_after: int) -> None:
        self.done_after = done_after
        self.polls = 0

    def __call__(self, seen: Seen) -> Answer:
        if seen.method == "POST":
            return 200, {"jobArn": ARN}, {}
        if seen.path != f"/model-invocation-job/{ENCODED}":
            return 404, {"message": "not found"}, {}
        self.polls += 1
        status = "Completed" if self.polls >= self.done_after else "InProgress"
        return 200, {"jobArn": ARN, "jobName": "j", "status": status}, {}


async def bedrock(
    tmp_path: Path, clock: FakeClock
) -> tuple[TestClient[Any, Any], Double, TestServer]:
    double = Double(Bedrock(done_after=3))
    server = await serve(double)
    upstream = str(server.make_url("")).rstrip("/")
    client = await gateway(tmp_path, clock, upstream, {"bedrock-test": bedrock_policy(upstream)})
    return client, double, server


async def test_boto3_reaches_an_arn_job_and_its_trailing_id_the_same_one(
    tmp_path: Path, clock: FakeClock
) -> None:
    """boto3's create_model_invocation_job and get_model_invocation_job (the ARN encoded in
    one segment) work through the gateway; the job's trailing id reaches the same operation,
    before and after it ends; the provider is always sent the ARN as botocore encodes it."""
    client, double, server = await bedrock(tmp_path, clock)
    sdk = boto3.client(
        "bedrock",
        endpoint_url=str(client.make_url("/p/bedrock-test")),
        region_name="us-east-1",
        aws_access_key_id=AGENT_TOKEN,
        aws_secret_access_key="unused",
    )
    try:
        created = await asyncio.to_thread(
            sdk.create_model_invocation_job,
            jobName="j",
            roleArn="arn:aws:iam::123456789012:role/r",
            modelId="anthropic.claude-3-haiku-20240307-v1:0",
            inputDataConfig={"s3InputDataConfig": {"s3Uri": "s3://in/"}},
            outputDataConfig={"s3OutputDataConfig": {"s3Uri": "s3://out/"}},
        )
        assert created["jobArn"] == ARN
        record = await record_of(client, "bedrock-test", ARN)
        assert record.provider_job_id == ARN
        await due(client, clock, "bedrock-test", ARN)
        got = await asyncio.to_thread(sdk.get_model_invocation_job, jobIdentifier=ARN)
        assert got["status"] == "InProgress"
        by_id = await client.get(
            "/p/bedrock-test/model-invocation-job/abc123def456", headers=bearer()
        )
        assert by_id.status == 200, await by_id.text()
        assert by_id.headers["Statusgate-Operation"] == record.operation_id
        for _ in range(2):
            await due(client, clock, "bedrock-test", ARN)
            got = await asyncio.to_thread(
                sdk.get_model_invocation_job, jobIdentifier="abc123def456"
            )
        assert got["status"] == "Completed"
        after = await client.get(
            f"/p/bedrock-test/model-invocation-job/{ENCODED}", headers=bearer()
        )
        assert after.headers["Statusgate-Outcome"] == "succeeded"
        again = await client.get(
            "/p/bedrock-test/model-invocation-job/abc123def456", headers=bearer()
        )
        assert again.headers["Statusgate-Operation"] == record.operation_id
        polls = double.calls("GET", "/model-invocation-job/")
        assert [s.path for s in polls] == [f"/model-invocation-job/{ENCODED}"] * 3
    finally:
        sdk.close()
        await client.close()
        await server.close()


@pytest.mark.parametrize(
    ("segment", "status"),
    [
        (quote("arn:aws:bedrock:us-east-1:123456789012:model-invocation-job/../x", safe=""), 400),
        (quote(ARN, safe="").replace("%2F", "%252F"), 400),  # encoded twice
        (quote("arn:aws:bedrock:us-east-1:1:model-invocation-job/a\\b", safe=""), 400),
        ("%ff%fe", 400),  # not UTF-8
        ("%2E%2E", 400),  # ".." itself
        (quote(ARN.replace("abc123def456", "zzz999zzz999"), safe=""), 404),
        ("zzz999zzz999", 404),
    ],
)
async def test_a_decoded_segment_is_an_arn_or_a_plain_id_and_nothing_else(
    tmp_path: Path, clock: FakeClock, segment: str, status: int
) -> None:
    """An encoded segment that decodes to a path step, a second encoding, a backslash or
    bytes that are not UTF-8 is invalid-request; an ARN or id of no operation of the account
    is unknown-operation. Neither reaches the provider."""
    client, double, server = await bedrock(tmp_path, clock)
    try:
        await client.post("/p/bedrock-test/model-invocation-job", json={}, headers=bearer())
        url = URL(
            f"{client.make_url('/p/bedrock-test/model-invocation-job')}/{segment}", encoded=True
        )
        answer = await client.session.get(url, headers=bearer())
        assert answer.status == status, await answer.text()
        assert double.calls("GET", "/") == []
    finally:
        await client.close()
        await server.close()


def test_arn_ids_are_decoded_in_matching_and_encoded_in_filling() -> None:
    """The route table hands handlers the decoded ARN; filling a provider path encodes it
    again exactly as botocore does, and leaves a plain id as it is."""
    policy = ProviderPolicy.model_validate(
        {
            **bedrock_policy("http://bedrock.example"),
            "credential": {"header": "Authorization", "value": "Bearer k"},
            "routes": {
                "submit": {"path": "/jobs", "job_id": {"from": "body", "path": "jobArn"}},
                "status": {"path": "/jobs/{job_id}"},
                "job_ids": "aws-arn",
            },
            "shape": None,
            "states": {"field": "status", "pending": ["InProgress"], "success": ["Completed"]},
        }
    )
    found = RouteTable(policy).match("GET", f"/jobs/{ENCODED}")
    assert found is not None and found.valid and found.job_id == ARN
    assert fill("/jobs/{job_id}", {"job_id": ARN}) == f"/jobs/{ENCODED}"
    assert fill("/jobs/{job_id}", {"job_id": "abc-1.2_3~"}) == "/jobs/abc-1.2_3~"
    raw = RouteTable(policy).match("GET", "/jobs/arn%3Aaws%3Abedrock%3A%3A%3Ax%2F%2E%2E")
    assert raw is not None and not raw.valid

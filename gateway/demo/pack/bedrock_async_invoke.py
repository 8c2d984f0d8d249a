"""Amazon Bedrock Runtime's asynchronous invocations (Nova Reel video and the like),
REST-JSON on the ``bedrock-runtime`` endpoint signed with SigV4 (service ``bedrock``): the
double of ``bedrock-async-invoke``.

Written from the Amazon Bedrock Runtime API reference:
https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_StartAsyncInvoke.html
and https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_GetAsyncInvoke.html.

- ``POST /async-invoke`` with ``modelId``, ``modelInput``, ``outputDataConfig`` (and
  ``clientRequestToken``, filled by boto3 with a fresh UUID: a repeated token is the same
  invocation) answers 200 ``{"invocationArn": "arn:aws:bedrock:<region>:<account>:
  async-invoke/<12 chars>"}``; a missing field is a ``ValidationException`` (400).
- ``GET /async-invoke/{invocationArn}``: the ARN, percent-encoded into the one segment;
  answers ``invocationArn``, ``modelArn``, ``status`` (``InProgress``, ``Completed``,
  ``Failed``), ``failureMessage`` when it failed, ``submitTime``, ``lastModifiedTime``,
  ``endTime`` once ended, and ``outputDataConfig`` (where the output is written: S3). An
  invocation it does not know is a ``ValidationException`` (the operation documents no
  404).

There is no cancel.
"""

from __future__ import annotations

import secrets
import string
from collections.abc import Iterable
from typing import Any

from aiohttp import web

from gateway.demo.jobs import Family, Job, Jobs
from gateway.demo.pack import Double, Example
from gateway.demo.pack.aws import denied, error, read_body, signed_by

ACCOUNT, REGION = "123456789012", "us-east-1"
ARN_PREFIX = f"arn:aws:bedrock:{REGION}:{ACCOUNT}:async-invoke/"
REQUIRED = ("modelId", "modelInput", "outputDataConfig")


def new_arn(request: web.Request) -> str:
    alphabet = string.ascii_lowercase + string.digits
    return ARN_PREFIX + "".join(secrets.choice(alphabet) for _ in range(12))


def _invocation(
    jobs: Jobs, request: web.Request, job: Job, state: str, step: dict[str, Any]
) -> dict[str, Any]:
    """``GetAsyncInvoke``'s answer for the invocation in ``state``."""
    asked = job.request
    model = str(asked.get("modelId", "amazon.nova-reel-v1:1"))
    body: dict[str, Any] = {
        "invocationArn": job.id,
        "modelArn": f"arn:aws:bedrock:{REGION}::foundation-model/{model}",
        "status": state,
        "submitTime": jobs.instant(job.created_at - jobs.clock()),
        "lastModifiedTime": jobs.instant(0),
        "outputDataConfig": asked.get("outputDataConfig"),
    }
    if "clientRequestToken" in asked:
        body["clientRequestToken"] = asked["clientRequestToken"]
    if state in ("Completed", "Failed"):
        body["endTime"] = jobs.instant(0)
    if state == "Failed":
        body["failureMessage"] = "The model input was rejected (scripted failure)."
    return body


FAMILY = Family(
    name="bedrock-async-invoke",
    state_field="status",
    id_prefix=ARN_PREFIX,
    success="Completed",
    result_field="outputDataConfig",
    result_value=None,
    error_field="failureMessage",
    default_script=({"state": "InProgress"}, {"state": "InProgress"}, {"state": "Completed"}),
    pending="InProgress",
    body=_invocation,
    auth=lambda request, key: signed_by(request, key, "bedrock"),
    new_id=new_arn,
    cancelled_script=(),
)


def routes(jobs: Jobs) -> Iterable[web.AbstractRouteDef]:
    tokens: dict[str, str] = {}  # clientRequestToken -> invocation ARN

    async def start(request: web.Request) -> web.Response:
        await read_body(request)
        if not signed_by(request, jobs.api_key, "bedrock"):
            jobs.record(request, None, "submit")
            return denied()
        try:
            payload = await request.json()
        except ValueError:
            payload = None
        if not isinstance(payload, dict) or any(k not in payload for k in REQUIRED):
            jobs.record(request, None, "submit")
            return error("ValidationException", f"{', '.join(REQUIRED)} are required.")
        token = payload.get("clientRequestToken")
        if isinstance(token, str) and token in tokens:
            jobs.record(request, tokens[token], "submit")
            return web.json_response({"invocationArn": tokens[token]})
        job, _, refused = await jobs.new_job(request, FAMILY, payload)
        if refused is not None:
            return refused
        if isinstance(token, str):
            tokens[token] = job.id
        return web.json_response({"invocationArn": job.id})

    async def get(request: web.Request) -> web.StreamResponse:
        arn = request.match_info["job_id"]
        if not signed_by(request, jobs.api_key, "bedrock"):
            jobs.record(request, arn, "status")
            return denied()
        if arn not in jobs.jobs:
            jobs.record(request, arn, "status")
            return error("ValidationException", f"Invocation {arn} was not found.")
        return await jobs.status(request, arn)

    return [web.post("/async-invoke", start), web.get("/async-invoke/{job_id}", get)]


DOUBLE = Double(
    provider="bedrock-async-invoke",
    reference="https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_GetAsyncInvoke.html",
    family=FAMILY,
    routes=routes,
    example=Example(
        "/async-invoke",
        {
            "modelId": "amazon.nova-reel-v1:1",
            "modelInput": {
                "taskType": "TEXT_VIDEO",
                "textToVideoParams": {"text": "A lighthouse at dawn"},
                "videoGenerationConfig": {"durationSeconds": 6, "fps": 24},
            },
            "outputDataConfig": {"s3OutputDataConfig": {"s3Uri": "s3://demo-out/videos/"}},
        },
    ),
)

"""Amazon Bedrock batch inference (model invocation jobs), REST-JSON signed with SigV4
(service ``bedrock``): the double of ``bedrock-batch``.

Written from the Amazon Bedrock API reference:
https://docs.aws.amazon.com/bedrock/latest/APIReference/API_CreateModelInvocationJob.html,
https://docs.aws.amazon.com/bedrock/latest/APIReference/API_GetModelInvocationJob.html,
https://docs.aws.amazon.com/bedrock/latest/APIReference/API_StopModelInvocationJob.html
and "Monitor batch inference jobs" in the Bedrock user guide
(https://docs.aws.amazon.com/bedrock/latest/userguide/batch-inference-monitor.html).

- ``POST /model-invocation-job`` with ``jobName``, ``roleArn``, ``modelId``,
  ``inputDataConfig``, ``outputDataConfig`` (and ``clientRequestToken``, which boto3 fills
  with a fresh UUID when the caller gives none: a repeated token is the same job) answers
  200 ``{"jobArn": "arn:aws:bedrock:<region>:<account>:model-invocation-job/<12 chars>"}``;
  a missing field is a ``ValidationException`` (400).
- ``GET /model-invocation-job/{jobIdentifier}``: the job ARN (boto3 percent-encodes it into
  the one segment) or its 12-character id; answers the job with its ``status``, one of
  ``Submitted``, ``Validating``, ``Scheduled``, ``InProgress``, ``Completed``,
  ``PartiallyCompleted``, ``Failed``, ``Stopping``, ``Stopped``, ``Expired``, its
  ``message`` when it failed, and the record counts; an unknown job is a
  ``ResourceNotFoundException`` (404).
- ``POST /model-invocation-job/{jobIdentifier}/stop`` answers 200 ``{}``; the job goes
  ``Stopping``, then ``Stopped``.

Results are JSONL files in the job's ``outputDataConfig.s3OutputDataConfig.s3Uri`` (S3,
another host). Timestamps are ISO 8601.
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
ARN_PREFIX = f"arn:aws:bedrock:{REGION}:{ACCOUNT}:model-invocation-job/"
REQUIRED = ("jobName", "roleArn", "modelId", "inputDataConfig", "outputDataConfig")
ENDED = ("Completed", "PartiallyCompleted", "Failed", "Stopped", "Expired")


def new_arn(request: web.Request) -> str:
    """A job ARN with a fresh 12-character id of lowercase letters and digits."""
    alphabet = string.ascii_lowercase + string.digits
    return ARN_PREFIX + "".join(secrets.choice(alphabet) for _ in range(12))


def _job(
    jobs: Jobs, request: web.Request, job: Job, state: str, step: dict[str, Any]
) -> dict[str, Any]:
    """``GetModelInvocationJob``'s answer for the job in ``state``."""
    asked = job.request
    body: dict[str, Any] = {
        "jobArn": job.id,
        "jobName": asked.get("jobName"),
        "modelId": asked.get("modelId"),
        "roleArn": asked.get("roleArn"),
        "status": state,
        "submitTime": jobs.instant(job.created_at - jobs.clock()),
        "lastModifiedTime": jobs.instant(0),
        "inputDataConfig": asked.get("inputDataConfig"),
        "outputDataConfig": asked.get("outputDataConfig"),
        "timeoutDurationInHours": asked.get("timeoutDurationInHours", 24),
        "jobExpirationTime": jobs.instant(job.created_at + 24 * 3600 - jobs.clock()),
        "modelInvocationType": "InvokeModel",
    }
    if "clientRequestToken" in asked:
        body["clientRequestToken"] = asked["clientRequestToken"]
    total = 2
    done = total if state in ("Completed", "PartiallyCompleted") else 0
    body |= {"totalRecordCount": total, "processedRecordCount": done}
    body |= {"successRecordCount": done - (state == "PartiallyCompleted"), "errorRecordCount": 0}
    if state in ENDED:
        body["endTime"] = jobs.instant(0)
    if state == "Failed":
        body["message"] = "The input file is not valid JSONL (scripted failure)."
    return body


FAMILY = Family(
    name="bedrock-batch",
    state_field="status",
    id_prefix=ARN_PREFIX,
    success="Completed",
    result_field="outputDataConfig",
    result_value=None,
    error_field="message",
    default_script=(
        {"state": "Submitted"},
        {"state": "Validating"},
        {"state": "Scheduled"},
        {"state": "InProgress"},
        {"state": "Completed"},
    ),
    pending="InProgress",
    body=_job,
    auth=lambda request, key: signed_by(request, key, "bedrock"),
    new_id=new_arn,
    cancelled_script=({"state": "Stopping"}, {"state": "Stopped"}),
)


def _named(identifier: str) -> str:
    """The job ARN an identifier names (the ARN itself, or its trailing id)."""
    return identifier if identifier.startswith("arn:") else ARN_PREFIX + identifier


def routes(jobs: Jobs) -> Iterable[web.AbstractRouteDef]:
    tokens: dict[str, str] = {}  # clientRequestToken -> job ARN

    async def create(request: web.Request) -> web.Response:
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
        if isinstance(token, str) and token in tokens:  # the same request again
            jobs.record(request, tokens[token], "submit")
            return web.json_response({"jobArn": tokens[token]})
        job, _, refused = await jobs.new_job(request, FAMILY, payload)
        if refused is not None:
            return refused
        if isinstance(token, str):
            tokens[token] = job.id
        return web.json_response({"jobArn": job.id})

    async def get(request: web.Request) -> web.StreamResponse:
        arn = _named(request.match_info["job_id"])
        if not signed_by(request, jobs.api_key, "bedrock"):
            jobs.record(request, arn, "status")
            return denied()
        if arn not in jobs.jobs:
            jobs.record(request, arn, "status")
            return error("ResourceNotFoundException", "The specified job was not found.", 404)
        return await jobs.status(request, arn)

    async def stop(request: web.Request) -> web.Response:
        arn = _named(request.match_info["job_id"])
        await read_body(request)
        job = jobs.find_job(request, "cancel", arn)
        if isinstance(job, web.Response):
            if job.status == 404:
                return error("ResourceNotFoundException", "The specified job was not found.", 404)
            return denied()
        step = job.script[min(job.index, len(job.script) - 1)]
        if step.get("state", FAMILY.pending) in ENDED:
            return error("ValidationException", "The job has already ended.")
        jobs.cancel_job(job)
        return web.json_response({})

    return [
        web.post("/model-invocation-job", create),
        web.get("/model-invocation-job/{job_id}", get),
        web.post("/model-invocation-job/{job_id}/stop", stop),
    ]


DOUBLE = Double(
    provider="bedrock-batch",
    reference="https://docs.aws.amazon.com/bedrock/latest/APIReference/API_GetModelInvocationJob.html",
    family=FAMILY,
    routes=routes,
    example=Example(
        "/model-invocation-job",
        {
            "jobName": "demo-batch-1",
            "roleArn": f"arn:aws:iam::{ACCOUNT}:role/BedrockBatchRole",
            "modelId": "anthropic.claude-3-haiku-20240307-v1:0",
            "inputDataConfig": {"s3InputDataConfig": {"s3Uri": "s3://demo-in/records.jsonl"}},
            "outputDataConfig": {"s3OutputDataConfig": {"s3Uri": "s3://demo-out/"}},
        },
    ),
)

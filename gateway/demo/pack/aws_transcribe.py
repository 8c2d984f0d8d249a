"""Amazon Transcribe's batch transcription jobs, as the AWS JSON 1.1 protocol carries them
(the double of ``aws-transcribe``; its real-server tests run against moto).

Written from the Amazon Transcribe API reference:
https://docs.aws.amazon.com/transcribe/latest/APIReference/API_StartTranscriptionJob.html,
https://docs.aws.amazon.com/transcribe/latest/APIReference/API_GetTranscriptionJob.html,
https://docs.aws.amazon.com/transcribe/latest/APIReference/API_TranscriptionJob.html and
https://docs.aws.amazon.com/transcribe/latest/APIReference/CommonErrors.html.

Every call is ``POST /`` with ``Content-Type: application/x-amz-json-1.1``, told apart by
``X-Amz-Target: Transcribe.<Operation>``, signed with SigV4 (service ``transcribe``).
``StartTranscriptionJob`` names the job itself (``TranscriptionJobName``; a name in use is
a ``ConflictException``) and answers the ``TranscriptionJob``; ``GetTranscriptionJob``
answers it again, ``TranscriptionJobStatus`` one of ``QUEUED``, ``IN_PROGRESS``,
``FAILED``, ``COMPLETED``; a completed job names its ``Transcript.TranscriptFileUri``, a
failed one its ``FailureReason``; an unknown name is a ``BadRequestException``. Times are
epoch seconds. Transcribe has no cancel of a running job.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from aiohttp import web

from gateway.demo.jobs import Family, Job, Jobs
from gateway.demo.pack import Double, Example
from gateway.demo.pack.aws import denied, error, read_body, signed_by

TARGET = "Transcribe."
JOB_NAME = web.RequestKey("transcribe_job_name", str)  # the name, for new_id


def _job(
    jobs: Jobs, request: web.Request, job: Job, state: str, step: dict[str, Any]
) -> dict[str, Any]:
    """A ``TranscriptionJob`` in its ``state``, wrapped as both operations answer it."""
    asked = job.request
    described: dict[str, Any] = {
        "TranscriptionJobName": job.id,
        "TranscriptionJobStatus": state,
        "LanguageCode": asked.get("LanguageCode", "en-US"),
        "Media": asked.get("Media", {}),
        "CreationTime": job.created_at,
    }
    if state != "QUEUED":
        described["StartTime"] = job.created_at + 1
    if state in ("COMPLETED", "FAILED"):
        described["CompletionTime"] = jobs.clock()
    if state == "COMPLETED":
        described["Transcript"] = {
            "TranscriptFileUri": (
                "https://s3.us-east-1.amazonaws.com/aws-transcribe-us-east-1-prod/"
                f"123456789012/{job.id}/asrOutput.json"
            )
        }
    if state == "FAILED":
        described["FailureReason"] = "The media format provided does not match the detected one."
    return {"TranscriptionJob": described}


FAMILY = Family(
    name="aws-transcribe",
    state_field="TranscriptionJob.TranscriptionJobStatus",
    id_prefix="",
    success="COMPLETED",
    result_field="Transcript",
    result_value=None,
    error_field="FailureReason",
    default_script=(
        {"state": "QUEUED"},
        {"state": "IN_PROGRESS"},
        {"state": "IN_PROGRESS"},
        {"state": "COMPLETED"},
    ),
    pending="IN_PROGRESS",
    body=_job,
    auth=lambda request, key: signed_by(request, key, "transcribe"),
    new_id=lambda request: str(request[JOB_NAME]),
    cancelled_script=(),
)


def routes(jobs: Jobs) -> Iterable[web.AbstractRouteDef]:
    async def rpc(request: web.Request) -> web.StreamResponse:
        target = request.headers.get("X-Amz-Target", "")
        await read_body(request)
        try:
            payload = await request.json()
        except ValueError:
            payload = None
        if not isinstance(payload, dict):
            return error("SerializationException", "Malformed JSON body", json_1_1=True)
        if not signed_by(request, jobs.api_key, "transcribe"):
            jobs.record(request, payload.get("TranscriptionJobName"), "denied")
            return denied(json_1_1=True)
        if target == TARGET + "StartTranscriptionJob":
            return await _start(jobs, request, payload)
        if target == TARGET + "GetTranscriptionJob":
            name = payload.get("TranscriptionJobName")
            if not isinstance(name, str) or name not in jobs.jobs:
                jobs.record(request, str(name), "status")
                return error(
                    "BadRequestException",
                    "The requested job couldn't be found. Check the job name and try your "
                    "request again.",
                    json_1_1=True,
                )
            return await jobs.status(request, name)
        return error("UnknownOperationException", f"Unknown operation {target}", json_1_1=True)

    return [web.post("/", rpc)]


async def _start(jobs: Jobs, request: web.Request, payload: dict[str, Any]) -> web.Response:
    name = payload.get("TranscriptionJobName")
    if not isinstance(name, str) or not name or "Media" not in payload:
        return error(
            "BadRequestException",
            "TranscriptionJobName and Media are required.",
            json_1_1=True,
        )
    if name in jobs.jobs:
        return error(
            "ConflictException",
            "The requested job name already exists. Use a different job name.",
            json_1_1=True,
        )
    request[JOB_NAME] = name
    job, _, refused = await jobs.new_job(request, FAMILY, payload)
    if refused is not None:
        return refused
    body = jobs.status_body(request, job, {"state": "IN_PROGRESS"})
    return web.json_response(body, content_type="application/x-amz-json-1.1")


DOUBLE = Double(
    provider="aws-transcribe",
    reference="https://docs.aws.amazon.com/transcribe/latest/APIReference/API_GetTranscriptionJob.html",
    family=FAMILY,
    routes=routes,
    example=Example(
        "/",
        {
            "TranscriptionJobName": "demo-call-1",
            "Media": {"MediaFileUri": "s3://recordings/call.wav"},
            "LanguageCode": "en-US",
        },
        headers={
            "X-Amz-Target": TARGET + "StartTranscriptionJob",
            "Content-Type": "application/x-amz-json-1.1",
        },
    ),
)

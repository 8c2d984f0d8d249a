"""A double of AssemblyAI's pre-recorded transcription API, written from its published
reference (https://www.assemblyai.com/docs/api-reference/transcripts/submit ,
.../transcripts/get, .../files/upload; the schemas as the official ``assemblyai`` SDK carries
them in ``assemblyai/types.py``: ``TranscriptStatus``, ``TranscriptResponse``), not from our
policy.

- ``POST /v2/upload`` (the raw audio bytes) -> 200 ``{"upload_url"}`` on AssemblyAI's CDN.
- ``POST /v2/transcript`` ``{audio_url, ...}`` -> 200, the transcript, ``status: queued``;
  400 ``{"error"}`` without ``audio_url``.
- ``GET /v2/transcript/{id}`` -> the transcript: ``id``, ``status`` (``queued``,
  ``processing``, ``completed``, ``error``), ``audio_url``, ``text``, ``words``,
  ``confidence``, ``audio_duration`` (once completed), ``error`` (once in error).
- Every call needs the bare key in ``Authorization: <key>`` (no scheme word; 401
  ``{"error"}`` otherwise); an unknown transcript is 404.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from aiohttp import web

from gateway.demo.jobs import Family, Job, Jobs
from gateway.demo.pack import Double, Example

CDN = "https://cdn.assemblyai.com/upload"
TEXT = "Statusgate paces the agents that poll this transcript."


def _words() -> list[dict[str, Any]]:
    words, start = [], 0
    for word in TEXT.split():
        words.append({"text": word, "start": start, "end": start + 300, "confidence": 0.98})
        start += 320
    return words


def _transcript(
    jobs: Jobs, request: web.Request, job: Job, state: str, step: dict[str, Any]
) -> dict[str, Any]:
    """A transcript as ``GET /v2/transcript/{id}`` returns it in ``state``."""
    done = state == "completed"
    return {
        "id": job.id,
        "status": state,
        "audio_url": job.request.get("audio_url"),
        "language_code": "en_us",
        "text": TEXT if done else None,
        "words": _words() if done else None,
        "utterances": None,
        "confidence": 0.98 if done else None,
        "audio_duration": 4 if done else None,
        "punctuate": True,
        "format_text": True,
        "webhook_url": job.request.get("webhook_url"),
        "error": "Download error: the audio file could not be fetched (scripted)"
        if state == "error"
        else None,
    }


def _authorised(request: web.Request, key: str) -> bool:
    return request.headers.get("Authorization") == key


FAMILY = Family(
    name="assemblyai",
    state_field="status",
    id_prefix="",
    success="completed",
    result_field="text",
    result_value=TEXT,
    error_field="error",
    default_script=(
        {"state": "queued"},
        {"state": "processing"},
        {"state": "processing"},
        {"state": "completed"},
    ),
    pending="processing",
    body=_transcript,
    auth=_authorised,
    new_id=lambda request: str(uuid.uuid4()),
)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def routes(jobs: Jobs) -> Iterable[web.AbstractRouteDef]:
    async def upload(request: web.Request) -> web.Response:
        jobs.record(request, None, "file")
        if not _authorised(request, jobs.api_key):
            return _error(401, "Authentication error, API token missing/invalid")
        name = str(uuid.uuid4())
        jobs.files[name] = await request.read()
        return web.json_response({"upload_url": f"{CDN}/{name}"})

    async def submit(request: web.Request) -> web.Response:
        try:
            asked = await request.json()
        except ValueError:
            asked = {}
        if not isinstance(asked, dict) or not asked.get("audio_url"):
            return _error(400, "audio_url is required")
        job, _, refused = await jobs.new_job(request, FAMILY, asked)
        if refused is not None:
            if refused.status == 401:
                return _error(401, "Authentication error, API token missing/invalid")
            return refused
        return web.json_response(jobs.status_body(request, job, {"state": "queued"}))

    async def get(request: web.Request) -> web.StreamResponse:
        answer = await jobs.status(request)
        if answer.status == 401:
            return _error(401, "Authentication error, API token missing/invalid")
        if answer.status == 404:
            return _error(404, "Transcript not found")
        return answer

    return [
        web.post("/v2/upload", upload),
        web.post("/v2/transcript", submit),
        web.get("/v2/transcript/{job_id}", get),
    ]


DOUBLE = Double(
    provider="assemblyai",
    reference="https://www.assemblyai.com/docs/api-reference/transcripts/submit",
    family=FAMILY,
    routes=routes,
    example=Example(
        "/v2/transcript",
        {"audio_url": "https://assembly.ai/wildfires.mp3", "speech_model": "universal"},
    ),
)

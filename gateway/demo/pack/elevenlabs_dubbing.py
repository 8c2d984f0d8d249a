"""A double of ElevenLabs' dubbing API (v1), written from its published reference
(https://elevenlabs.io/docs/api-reference/dubbing/create , .../dubbing/get ,
.../dubbing/audio/get; the schemas as the official ``elevenlabs`` SDK, generated from
ElevenLabs' API definition, carries them: ``DoDubbingResponse``, ``DubbingMetadataResponse``,
and the status filter ``dubbing`` / ``dubbed`` / ``failed``), not from our policy.

- ``POST /v1/dubbing`` (multipart form: ``file`` or ``source_url``, ``target_lang``,
  ``source_lang``, ``name``, ...) -> 200 ``{"dubbing_id", "expected_duration_sec"}``; 422
  without a source or a target language. (This double also takes the fields as a JSON
  body, for ``statusgate demo``.)
- ``GET /v1/dubbing/{dubbing_id}`` -> ``dubbing_id``, ``name``, ``status`` (``dubbing``,
  ``dubbed``, ``failed``), ``source_language``, ``target_languages``, ``editable``,
  ``created_at``, ``media_metadata`` (``content_type``, ``duration``), ``error`` (once
  failed).
- ``GET /v1/dubbing/{dubbing_id}/audio/{language_code}`` -> the dubbed file (``audio/mpeg``)
  once dubbed; 404 for a language the project was not dubbed into, 425 before it is done.
- Every call needs ``xi-api-key: <key>`` (401 otherwise); an unknown project is 404.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import string
from collections.abc import Iterable
from typing import Any

from aiohttp import BodyPartReader, web

from gateway.demo.jobs import Family, Job, Jobs
from gateway.demo.pack import Double, Example

ALPHABET = string.ascii_letters + string.digits
AUDIO = b"ID3\x04\x00demo dubbed audio"
EXPECTED_SECONDS = 120  # what create answers as expected_duration_sec


def _metadata(
    jobs: Jobs, request: web.Request, job: Job, state: str, step: dict[str, Any]
) -> dict[str, Any]:
    """A dubbing project as ``GET /v1/dubbing/{id}`` returns it in ``state``."""
    asked = job.request
    return {
        "dubbing_id": job.id,
        "name": asked.get("name") or "demo dub",
        "status": state,
        "source_language": asked.get("source_lang") or "en",
        "target_languages": [asked.get("target_lang", "es")],
        "editable": False,
        "created_at": jobs.instant(job.created_at - jobs.clock()),
        "media_metadata": {"content_type": "audio/mpeg", "duration": 42.0},
        "error": "Dubbing failed: no speech detected (scripted)" if state == "failed" else None,
    }


def _authorised(request: web.Request, key: str) -> bool:
    return request.headers.get("xi-api-key") == key


FAMILY = Family(
    name="elevenlabs-dubbing",
    state_field="status",
    id_prefix="",
    success="dubbed",
    result_field="target_languages",
    result_value=None,
    error_field="error",
    default_script=({"state": "dubbing"}, {"state": "dubbing"}, {"state": "dubbed"}),
    pending="dubbing",
    body=_metadata,
    auth=_authorised,
    new_id=lambda request: "".join(secrets.choice(ALPHABET) for _ in range(20)),
)


def _detail(status: int, kind: str, message: str) -> web.Response:
    return web.json_response({"detail": {"status": kind, "message": message}}, status=status)


async def _form(request: web.Request) -> dict[str, Any]:
    """The create call's form fields (a file part counts as given, its bytes unread)."""
    fields: dict[str, Any] = {}
    if request.content_type == "multipart/form-data":
        async for part in await request.multipart():
            if not isinstance(part, BodyPartReader) or part.name is None:
                continue
            fields[part.name] = "<file>" if part.filename else await part.text()
    elif request.content_type == "application/x-www-form-urlencoded":
        fields.update(await request.post())
    elif request.content_type == "application/json":  # this double only: statusgate demo
        body = await request.json()
        fields.update(body if isinstance(body, dict) else {})
    return fields


def routes(jobs: Jobs) -> Iterable[web.AbstractRouteDef]:
    async def create(request: web.Request) -> web.Response:
        fields = await _form(request)
        if not (fields.get("file") or fields.get("source_url")) or not fields.get("target_lang"):
            return _detail(422, "invalid_request", "a file or source_url and target_lang")
        job, _, refused = await jobs.new_job(request, FAMILY, fields)
        if refused is not None:
            return _detail(401, "invalid_api_key", "Invalid API key")
        body = {"dubbing_id": job.id, "expected_duration_sec": EXPECTED_SECONDS}
        return web.json_response(body)

    answered: dict[str, str] = {}  # the status each project last reported

    async def get(request: web.Request) -> web.StreamResponse:
        answer = await jobs.status(request)
        if isinstance(answer, web.Response) and isinstance(answer.body, bytes):
            with contextlib.suppress(ValueError, AttributeError, KeyError):
                answered[request.match_info["job_id"]] = json.loads(answer.body)["status"]
        if answer.status == 401:
            return _detail(401, "invalid_api_key", "Invalid API key")
        if answer.status == 404:
            return _detail(404, "dubbing_not_found", "Dubbing project not found")
        return answer

    async def audio(request: web.Request) -> web.Response:
        job = jobs.find_job(request, "result")
        if isinstance(job, web.Response):
            return _detail(job.status, "not_found", "Dubbing project not found")
        if request.match_info["language_code"] != job.request.get("target_lang"):
            return _detail(404, "language_not_found", "Not dubbed into this language")
        if answered.get(job.id) != "dubbed":
            return _detail(425, "dubbing_not_finished", "The dubbing is not finished yet")
        return web.Response(body=AUDIO, content_type="audio/mpeg")

    return [
        web.post("/v1/dubbing", create),
        web.get("/v1/dubbing/{job_id}", get),
        web.get("/v1/dubbing/{job_id}/audio/{language_code}", audio),
    ]


DOUBLE = Double(
    provider="elevenlabs-dubbing",
    reference="https://elevenlabs.io/docs/api-reference/dubbing/create",
    family=FAMILY,
    routes=routes,
    example=Example(
        "/v1/dubbing",
        {"source_url": "https://example.com/talk.mp4", "target_lang": "es"},
    ),
)

"""Veo video generation on the Gemini API: long-running operations (the Veo paths of the
``google-operations`` double; mounted with the demo provider's Google family under
``/google-operations``, not a double of its own: see ``DemoProvider.app``).

Written from the Gemini API reference and guide, "Generate videos with Veo"
(https://ai.google.dev/gemini-api/docs/video), ``models.predictLongRunning`` and
``operations.get`` (https://ai.google.dev/api/models#method:-models.predictlongrunning),
and from how google-genai reads the answers (``google/genai/_operations_converters.py``):

- ``POST /v1beta/models/{model}:predictLongRunning`` with ``{"instances": [{"prompt": ...}],
  "parameters": {...}}`` answers an Operation named
  ``models/{model}/operations/{id}`` (``done`` absent, as proto3 JSON leaves out false).
- ``GET /v1beta/models/{model}/operations/{id}`` answers it again; once done, ``done`` is
  true with ``response.generateVideoResponse.generatedSamples[].video.uri`` (a download URL
  of the Files API) or with ``error``; videos the safety filters removed are counted in
  ``raiMediaFilteredCount``.
- ``GET /v1beta/files/{id}:download?alt=media`` answers the video (``video/mp4``).

The key is read from ``x-goog-api-key`` or ``?key=``; a wrong one is 400 API_KEY_INVALID.
The shipped google-operations policy does not route these paths (its one submit route is
another's; docs/providers.md says why): they are here for the demo provider to speak Veo
as the reference has it.
Step states: ``running`` (``done`` absent), ``done``, ``failed``, ``filtered`` (done, every
video filtered out: a response with no samples).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from typing import Any

from aiohttp import web

from gateway.demo.jobs import Family, Job, Jobs
from gateway.demo.pack.google import api_key, error, key_rejected, not_found

PUBLIC = "https://generativelanguage.googleapis.com"  # where the Files API's URLs point
VIDEO = b"\x00\x00\x00\x18ftypmp42demo-video"  # the start of an MP4, as a stand-in
TYPE = "type.googleapis.com/google.ai.generativelanguage.v1beta.PredictLongRunningResponse"


def _video_file(job: Job) -> str:
    return "video-" + job.id.rsplit("/", 1)[-1].removeprefix("op-")


def _operation(
    jobs: Jobs, request: web.Request, job: Job, state: str, step: dict[str, Any]
) -> dict[str, Any]:
    """The Operation ``operations.get`` answers for the job in ``state``."""
    body: dict[str, Any] = {"name": job.id}
    if state == "done":
        uri = f"{PUBLIC}/v1beta/files/{_video_file(job)}:download?alt=media"
        samples = [{"video": {"uri": uri}}]
        made = {"@type": TYPE, "generateVideoResponse": {"generatedSamples": samples}}
        body |= {"done": True, "response": made}
    elif state == "filtered":
        reasons = ["The video was filtered out (scripted)."]
        answer: dict[str, Any] = {"raiMediaFilteredCount": 1, "raiMediaFilteredReasons": reasons}
        body |= {"done": True, "response": {"@type": TYPE, "generateVideoResponse": answer}}
    elif state == "failed":
        body |= {"done": True, "error": {"code": 3, "message": "The prompt was rejected."}}
    return body


FAMILY = Family(
    name="veo",
    state_field="done",
    id_prefix="op-",
    success="done",
    result_field="response",
    result_value=None,
    error_field="error",
    default_script=({"state": "running"}, {"state": "running"}, {"state": "done"}),
    pending="running",
    body=_operation,
    auth=api_key,
    new_id=lambda request: (
        f"models/{request.match_info['model']}/operations/op-{secrets.token_hex(6)}"
    ),
    cancelled_script=(),
)


def routes(jobs: Jobs) -> Iterable[web.AbstractRouteDef]:
    async def predict(request: web.Request) -> web.Response:
        if not api_key(request, jobs.api_key):
            jobs.record(request, None, "submit")
            return key_rejected()
        try:
            payload = await request.json()
        except ValueError:
            payload = None
        if not isinstance(payload, dict) or not payload.get("instances"):
            jobs.record(request, None, "submit")
            return error(400, "instances is required.")
        job, _, refused = await jobs.new_job(request, FAMILY, payload)
        if refused is not None:
            return refused
        return web.json_response({"name": job.id})

    async def get(request: web.Request) -> web.StreamResponse:
        info = request.match_info
        name = f"models/{info['model']}/operations/{info['op']}"
        if not api_key(request, jobs.api_key):
            jobs.record(request, name, "status")
            return key_rejected()
        if name not in jobs.jobs:
            return not_found(jobs, request, name, "status")
        return await jobs.status(request, name)

    async def download(request: web.Request) -> web.Response:
        file = request.match_info["file"]
        jobs.record(request, file, "result")
        if not api_key(request, jobs.api_key):
            return key_rejected()
        known = any(j.family is FAMILY and _video_file(j) == file for j in list(jobs.jobs.values()))
        if not known or request.query.get("alt") != "media":
            return error(404, f"files/{file} not found.")
        return web.Response(body=VIDEO, content_type="video/mp4")

    return [
        web.post("/v1beta/models/{model}:predictLongRunning", predict),
        web.get("/v1beta/models/{model}/operations/{op}", get),
        web.get("/v1beta/files/{file}:download", download),
    ]

"""What several of the pack's doubles do alike, each as its provider's reference has it:
check a key in a header, read a JSON body, take a file upload (multipart or raw), serve a
stored file, answer an error in the provider's own envelope. Not a double itself (it
defines no DOUBLE and is not in ``MODULES``); owns no routes.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import BodyPartReader, web

from gateway.demo.jobs import Family, Jobs

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def bearer(request: web.Request, key: str) -> bool:
    """``Authorization: Bearer <key>`` (OpenAI, Groq, Together, Mistral, Fireworks)."""
    return request.headers.get("Authorization") == f"Bearer {key}"


def header_key(name: str) -> Callable[[web.Request, str], bool]:
    """The key alone in a header of its own (Azure's ``api-key``)."""

    def check(request: web.Request, key: str) -> bool:
        return request.headers.get(name) == key

    return check


async def json_body(request: web.Request) -> dict[str, Any]:
    """The request's JSON object, or an empty one when it has none."""
    try:
        payload = await request.json()
    except (ValueError, UnicodeDecodeError):
        return {}
    return payload if isinstance(payload, dict) else {}


def error(status: int, message: str, kind: str, code: str | None = None) -> web.Response:
    """The ``{"error": {"message", "type", "code"}}`` envelope of OpenAI-style APIs."""
    body = {"error": {"message": message, "type": kind, "code": code}}
    return web.json_response(body, status=status)


@dataclass(frozen=True)
class Upload:
    file_id: str
    content: bytes
    filename: str
    purpose: str


async def take_upload(
    jobs: Jobs, request: web.Request, prefix: str = "file-", file_id: str | None = None
) -> Upload:
    """A file upload, multipart (``file`` and ``purpose`` parts, as the SDKs send it) or
    raw, kept in ``jobs.files`` under ``file_id`` (default: ``prefix`` and hex digits)."""
    filename, purpose, content = "upload", "batch", b""
    if request.content_type == "multipart/form-data":
        async for part in await request.multipart():
            if not isinstance(part, BodyPartReader):
                continue
            if part.name == "file":
                filename = part.filename or filename
                content = await part.read()
            elif part.name == "purpose":
                purpose = await part.text()
    else:
        content = await request.read()
    file_id = file_id or f"{prefix}{secrets.token_hex(8)}"
    jobs.files[file_id] = content
    return Upload(file_id, content, filename, purpose)


def file_content(jobs: Jobs, file_id: str, content_type: str) -> web.Response | None:
    """A stored file's bytes, or None when there is no such file."""
    content = jobs.files.get(file_id)
    if content is None:
        return None
    return web.Response(body=content, content_type=content_type)


def batch_output(request_body: dict[str, Any], *, job_id: str) -> bytes:
    """The JSONL output of a finished batch: one line per request of its input (one line
    when the input is unknown), each an OpenAI-style chat completion."""
    lines = []
    for n, custom_id in enumerate(_custom_ids(request_body), start=1):
        answer = {
            "id": f"chatcmpl-{job_id[-6:]}-{n}",
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "demo answer"},
                    "finish_reason": "stop",
                }
            ],
        }
        response = {"status_code": 200, "request_id": f"req_{n}", "body": answer}
        lines.append(json.dumps({"id": f"batch_req_{n}", "custom_id": custom_id,
                                 "response": response, "error": None}))  # fmt: skip
    return ("\n".join(lines) + "\n").encode()


def _custom_ids(request_body: dict[str, Any]) -> list[str]:
    requests = request_body.get("requests")
    if isinstance(requests, list) and requests:
        return [str(r.get("custom_id", n)) if isinstance(r, dict) else str(n)
                for n, r in enumerate(requests)]  # fmt: skip
    return ["request-1"]


def openai_files(
    jobs: Jobs,
    family: Family,
    prefix: str,
    file_prefix: str = "file-",
    wrap: Callable[[Handler], Handler] = lambda handler: handler,
) -> list[web.AbstractRouteDef]:
    """The two Files endpoints of OpenAI-style APIs around a job, under ``prefix``: upload
    (``POST <prefix>/files``, answered with the file object) and content (``GET
    <prefix>/files/{id}/content``), each through ``wrap`` (a provider's own checks)."""

    async def upload(request: web.Request) -> web.StreamResponse:
        jobs.record(request, None, "file")
        if not jobs.authorised(request, family):
            return jobs.denied()
        got = await take_upload(jobs, request, file_prefix)
        body = {
            "id": got.file_id,
            "object": "file",
            "bytes": len(got.content),
            "created_at": int(jobs.clock()),
            "filename": got.filename,
            "purpose": got.purpose,
            "status": "processed",
            "status_details": None,
        }
        return web.json_response(body)

    async def content(request: web.Request) -> web.StreamResponse:
        file_id = request.match_info["file_id"]
        jobs.record(request, file_id, "result")
        if not jobs.authorised(request, family):
            return jobs.denied()
        found = file_content(jobs, file_id, "application/octet-stream")
        if found is None:
            return error(404, f"No such File object: {file_id}", "invalid_request_error")
        return found

    return [
        web.post(f"{prefix}/files", wrap(upload)),
        web.get(f"{prefix}/files/{{file_id}}/content", wrap(content)),
    ]

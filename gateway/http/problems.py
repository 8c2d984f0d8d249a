"""Problem responses (RFC 9457) from the table in gateway/core/problems.py, and the
``/problems/<slug>`` explanations."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from aiohttp import web

from gateway.core.problems import PROBLEMS, body, retry_after_ms, retry_after_value

CONTENT_TYPE = "application/problem+json"
SLUG = web.ResponseKey("slug", str)  # read by the agent_requests metric


def problem(
    slug: str,
    detail: str,
    *,
    operation_id: str | None = None,
    retry_after: float | None = None,
    headers: Mapping[str, str] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> web.Response:
    kind = PROBLEMS[slug]
    response = web.Response(
        status=kind.status,
        body=orjson.dumps(body(slug, detail, operation_id=operation_id, extra=extra)),
        content_type=CONTENT_TYPE,
        headers=headers,
    )
    response[SLUG] = slug
    if retry_after is not None:
        response.headers["Retry-After"] = retry_after_value(retry_after)
        response.headers["Retry-After-Ms"] = retry_after_ms(retry_after)
    if kind.retry is not None:
        response.headers["X-Should-Retry"] = "true" if kind.retry else "false"
    if kind.status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="statusgate"'
    return response


async def explain(request: web.Request) -> web.Response:
    """GET /problems/<slug>: a short human explanation of one problem type."""
    slug = request.match_info["slug"]
    kind = PROBLEMS.get(slug)
    if kind is None:
        return problem("invalid-request", "There is no problem type of that name.")
    text = f"{kind.title} ({kind.status})\n\n{kind.explanation}\n"
    return web.Response(text=text, content_type="text/plain")

"""What the Google doubles of the pack share: Google's error body and the two ways its APIs
take a credential. Not a double itself (not in ``MODULES``).

References: "Errors" of the Google Cloud API design guide
(https://cloud.google.com/apis/design/errors: ``{"error": {"code", "message", "status"}}``),
"Using API keys" (https://ai.google.dev/gemini-api/docs/api-key: the Gemini API reads the key
from ``x-goog-api-key`` or ``?key=``), and Vertex AI's REST authentication
(https://cloud.google.com/vertex-ai/docs/authentication: ``Authorization: Bearer <OAuth 2.0
access token>``).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gateway.demo.jobs import Jobs

# google.rpc.Code names by HTTP status, as Google's APIs pair them
STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ALREADY_EXISTS",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}


def error(code: int, message: str, **extra: Any) -> web.Response:
    """A Google API error answer."""
    body = {"error": {"code": code, "message": message, "status": STATUS.get(code, "UNKNOWN")}}
    body["error"].update(extra)
    return web.json_response(body, status=code)


def api_key(request: web.Request, key: str) -> bool:
    """The Gemini API's key, in ``x-goog-api-key`` or the ``key`` query parameter."""
    return key in (request.headers.get("x-goog-api-key"), request.query.get("key"))


def bearer(request: web.Request, token: str) -> bool:
    """An OAuth 2.0 access token, as Vertex AI takes it."""
    return request.headers.get("Authorization") == f"Bearer {token}"


def key_rejected() -> web.Response:
    """The Gemini API's answer to a missing or wrong API key."""
    return error(
        400,
        "API key not valid. Please pass a valid API key.",
        details=[
            {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID"}
        ],
    )


def token_rejected() -> web.Response:
    """Vertex AI's answer to a missing or expired access token."""
    return error(
        401,
        "Request had invalid authentication credentials. Expected OAuth 2 access token, "
        "login cookie or other valid authentication credential.",
    )


def not_found(jobs: Jobs, request: web.Request, name: str, kind: str) -> web.Response:
    """A resource the double does not know, the call logged."""
    jobs.record(request, name, kind)
    return error(404, f"{name} not found.")

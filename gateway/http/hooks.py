"""``POST /hooks/{provider}``: a provider's webhooks (SPEC 23), on the agent listener.

No bearer token: the push's signature is its authentication (flow/pushes.py checks it).
Answers are short JSON the provider ignores; only the status matters to it: 200 handled or
a replay ignored, 202 nothing to do (an unknown job, an unreadable push), 401 refused
(retried by the provider, which never helps a bad signature: it is counted and audited).
"""

from __future__ import annotations

from aiohttp import web

from gateway.flow import pushes
from gateway.flow.runtime import RUNTIME
from gateway.http.bodies import read_limited
from gateway.http.problems import problem


async def handle(request: web.Request) -> web.StreamResponse:
    """One push for the provider the path names."""
    runtime = request.app[RUNTIME]
    name = request.match_info["provider"]
    policy = runtime.settings.policies.get(name)
    if policy is None or policy.pushes is None:
        return problem("unknown-provider", f"No provider named {name!r} accepts pushes here.")
    limits = runtime.settings.file.limits
    body = await read_limited(request, limits.max_request_body, limits.body_timeout)
    received = await pushes.receive(runtime, policy, request.headers, body)
    return web.json_response({"result": received.result}, status=received.status)


def routes(app: web.Application) -> None:
    """Add the push route to ``app``."""
    app.router.add_post("/hooks/{provider}", handle)

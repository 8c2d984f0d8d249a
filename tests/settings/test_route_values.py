"""Tracked routes that name more than the job (fal's ``/{owner}/{app}/requests/{job_id}``,
ElevenLabs' ``/v1/dubbing/{job_id}/audio/{language_code}``): the extra segments are matched
and sent on, the operation is still found by its job id alone, and the gateway's own polls use
the values the submit was sent to. Real gateways in front of a real aiohttp provider."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from test_policy_language import AUTH, NOW, Provider, base_policy, gateway, provider

from gateway import ConfigError
from gateway.settings.policy import load_policy

from conftest import FakeClock

__all__ = ["gateway", "provider"]  # the fixtures, used by name


def app_policy(upstream: str, **routes: Any) -> dict[str, Any]:
    """A fal-like queue: the app's owner and name in every path besides the job id."""
    app = "/{owner}/{app}/requests/{job_id}"
    return base_policy(
        upstream,
        routes={
            "submit": {
                "method": "POST",
                "path": "/{owner}/{app}",
                "job_id": {"from": "body", "path": "request_id"},
            },
            "status": {"method": "GET", "path": app + "/status"},
            "result": {"method": "GET", "path": app + "/audio/{language_code}"},
            "cancel": {"method": "PUT", "path": app + "/cancel", "by": "agent"},
            **routes,
        },
        states={"field": "status", "pending": ["IN_QUEUE"], "success": ["COMPLETED"]},
    )


async def test_extra_segments_are_sent_where_the_job_was_submitted(
    provider: tuple[Provider, str], gateway: Callable[..., Any]
) -> None:
    """The submit's owner and app are kept with the operation: the gateway's own poll (a
    held submit) and the agent's status calls reach the provider at that app, and
    the result route's extra segment is the agent's."""
    fake, upstream = provider
    fake.answers["/acme/voice/requests/r1/status"] = lambda r, b: web.json_response(
        {"status": next(states)}
    )
    states = iter(["IN_QUEUE", "IN_QUEUE", "COMPLETED"])
    fake.answers["/acme/voice/requests/r1/audio"] = lambda r, b: web.json_response({"a": 1})
    fake.answers["/acme/voice"] = lambda r, b: web.json_response({"request_id": "r1"})
    clock = FakeClock(NOW)
    client = await gateway(app_policy(upstream), clock)
    submitted = await client.post("/p/p/acme/voice", json={}, headers={**AUTH, "Prefer": "wait=1"})
    assert submitted.status == 200, await submitted.text()
    location = "http://gateway.test/p/p/acme/voice/requests/r1/status"
    assert submitted.headers["Location"] == location
    clock.advance(5.0)
    # the job id is the identity: another app's path finds it and polls it where it lives
    polled = await client.get("/p/p/other/app/requests/r1/status", headers=AUTH)
    assert polled.headers["Statusgate-Outcome"] == "pending", await polled.text()
    clock.advance(10.0)
    done = await client.get("/p/p/acme/voice/requests/r1/status", headers=AUTH)
    assert done.headers["Statusgate-Outcome"] == "succeeded", await done.text()
    audio = await client.get("/p/p/acme/voice/requests/r1/audio/en-GB", headers=AUTH)
    assert audio.status == 200, await audio.text()
    paths = [s["path"] for s in fake.seen]
    assert paths == [
        "/acme/voice",
        "/acme/voice/requests/r1/status",  # the held submit's poll, made by the gateway
        "/acme/voice/requests/r1/status",
        "/acme/voice/requests/r1/status",
        "/acme/voice/requests/r1/audio/en-GB",
    ]


async def test_an_agents_cancel_goes_to_the_submitted_app(
    provider: tuple[Provider, str], gateway: Callable[..., Any]
) -> None:
    """An agent's cancel is sent to the app the job was submitted to, whatever app its
    own path named."""
    fake, upstream = provider
    fake.answers["/acme/voice/requests/r2/cancel"] = lambda r, b: web.json_response({}, status=202)
    fake.answers["/acme/voice"] = lambda r, b: web.json_response({"request_id": "r2"})
    client = await gateway(app_policy(upstream))
    submitted = await client.post("/p/p/acme/voice", json={}, headers=AUTH)
    assert submitted.status == 200, await submitted.text()
    cancelled = await client.put("/p/p/other/app/requests/r2/cancel", headers=AUTH)
    assert cancelled.status == 202, await cancelled.text()
    assert [(s["method"], s["path"]) for s in fake.seen] == [
        ("POST", "/acme/voice"),
        ("PUT", "/acme/voice/requests/r2/cancel"),
    ]


async def test_bad_extra_segments_never_reach_the_provider(
    provider: tuple[Provider, str], gateway: Callable[..., Any]
) -> None:
    """An extra segment is checked like a job id: an encoded slash or a dot-dot is refused
    before anything is sent."""
    fake, upstream = provider
    client = await gateway(app_policy(upstream))
    for path in ("/p/p/acme/voice/requests/r1/audio/..", "/p/p/acme/voice/requests/r1/audio/a%2Fb"):
        answer = await client.get(path, headers=AUTH)
        assert answer.status in (400, 404), path
    assert fake.seen == []


@pytest.mark.parametrize(
    ("routes", "message"),
    [
        (
            {"status": {"path": "/{owner}/{region}/requests/{job_id}/status"}},
            "routes.status.path: {region} must also be in routes.submit.path: the gateway "
            "polls the job with the values its submit was sent to",
        ),
        (
            {"cancel": {"method": "PUT", "path": "/{owner}/{app}/{job_id}/{step}"}},
            "routes.cancel.path: {step} must also be in routes.submit.path: the gateway "
            "polls the job with the values its submit was sent to",
        ),
        (
            {"status": {"path": "/{owner}/{app}/requests/status"}},
            "routes.status.path: must contain {job_id} or {job_id*} exactly once, or the route "
            "must read the job id from the request body (job_id: {from: request, path: P})",
        ),
    ],
)
def test_extra_placeholders_the_gateway_cannot_fill_fail_check(
    tmp_path: Path, routes: dict[str, Any], message: str
) -> None:
    """A status or cancel route's extra placeholder must come from the submit (the gateway
    polls and cancels on its own); a route still needs its one job id."""
    path = tmp_path / "p.yaml"
    policy = app_policy("http://x.test")
    policy["routes"].update(routes)
    path.write_text(yaml.safe_dump(policy))
    with pytest.raises(ConfigError) as failed:
        load_policy(path, "p.yaml", {})
    assert any(line.endswith(message) for line in failed.value.problems), failed.value.problems


def test_extra_placeholders_load(tmp_path: Path) -> None:
    """The fal-like policy, extra placeholders on every tracked route, loads."""
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(app_policy("http://x.test")))
    assert load_policy(path, "p.yaml", {}).routes.result is not None


async def test_more_submit_paths_are_each_sent_as_called(
    provider: tuple[Provider, str], gateway: Callable[..., Any]
) -> None:
    """``routes.submit.more_paths``: a provider's further create endpoints (fal's apps with
    a sub-path, Runway's per-model ones) are submits too, each sent to the provider at the
    path the agent called; the job is then polled with the values all forms share."""
    fake, upstream = provider
    fake.answers["/acme/voice/requests/r3/status"] = lambda r, b: web.json_response(
        {"status": "COMPLETED"}
    )
    fake.answers["/acme/voice"] = lambda r, b: web.json_response({"request_id": "r3"})
    policy = app_policy(upstream)
    policy["routes"]["submit"]["more_paths"] = ["/{owner}/{app}/{path}"]
    clock = FakeClock(NOW)
    client = await gateway(policy, clock)
    submitted = await client.post("/p/p/acme/voice/dev", json={}, headers=AUTH)
    assert submitted.status == 200, await submitted.text()
    assert submitted.headers["Location"].endswith("/p/p/acme/voice/requests/r3/status")
    clock.advance(5.0)
    done = await client.get("/p/p/acme/voice/requests/r3/status", headers=AUTH)
    assert done.headers["Statusgate-Outcome"] == "succeeded", await done.text()
    assert [s["path"] for s in fake.seen] == ["/acme/voice/dev", "/acme/voice/requests/r3/status"]


def test_a_status_extra_must_be_in_every_submit_path(tmp_path: Path) -> None:
    """A status route's extra placeholder must be named by every submit path, or the
    gateway could not poll a job submitted through the path that lacks it."""
    path = tmp_path / "p.yaml"
    policy = app_policy("http://x.test")
    policy["routes"]["submit"]["more_paths"] = ["/v2/{owner}/run"]
    path.write_text(yaml.safe_dump(policy))
    with pytest.raises(ConfigError) as failed:
        load_policy(path, "p.yaml", {})
    assert any(
        line.endswith(
            "routes.status.path: {app} must also be in routes.submit.path: the "
            "gateway polls the job with the values its submit was sent to"
        )
        for line in failed.value.problems
    ), failed.value.problems

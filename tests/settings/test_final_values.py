"""Result routes filled from the final answer with values of several segments or URLs
(Gemini's ``files/abc``, Fireworks' dataset names, Veo's video ``uri``): served when safe,
refused clearly when a value could leave the provider's path or origin. Real gateways in
front of a real aiohttp provider."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp import web
from test_policy_language import AUTH, NOW, Provider, base_policy, gateway, provider

from conftest import FakeClock

__all__ = ["gateway", "provider"]  # the fixtures, used by name


def file_policy(upstream: str, result: str) -> dict[str, Any]:
    return base_policy(
        upstream,
        routes={
            "submit": {
                "method": "POST",
                "path": "/v1/jobs",
                "job_id": {"from": "body", "path": "id"},
            },
            "status": {"method": "GET", "path": "/v1/jobs/{job_id}"},
            "result": {"method": "GET", "path": result},
        },
        states={
            "field": "state",
            "pending": ["RUNNING"],
            "success": ["DONE"],
            "success_requires": ["output"],
        },
    )


async def fetched(
    fake: Provider, upstream: str, gateway: Callable[..., Any], result: str, output: Any
) -> tuple[Any, list[str]]:
    """Submit, see the job DONE with ``output``, fetch its result: the answer and the
    paths that reached the provider after the status poll."""
    fake.answers["/v1/jobs/j1"] = lambda r, b: web.json_response(
        {"id": "j1", "state": "DONE", "output": output}
    )
    fake.answers["/v1/jobs"] = lambda r, b: web.json_response({"id": "j1", "state": "RUNNING"})
    fake.answers["/v1beta/"] = lambda r, b: web.Response(body=b"the file")
    clock = FakeClock(NOW)
    client = await gateway(file_policy(upstream, result), clock)
    assert (await client.post("/p/p/v1/jobs", json={}, headers=AUTH)).status == 200
    clock.advance(5.0)
    done = await client.get("/p/p/v1/jobs/j1", headers=AUTH)
    assert done.headers["Statusgate-Outcome"] == "succeeded", await done.text()
    # agents call the result route with the job id in the {final.*} segment
    agent_path = re.sub(r"\{final\.[^}]*\}", "j1", result.partition("?")[0])
    answer = await client.get(f"/p/p{agent_path}", headers=AUTH)
    return answer, [s["path"] for s in fake.seen[2:]]


@pytest.mark.parametrize(
    ("output", "sent"),
    [
        ({"file": "files/abc-123"}, "/v1beta/files/abc-123:download?alt=media"),
        ({"file": "accounts/a/datasets/d"}, "/v1beta/accounts/a/datasets/d:download?alt=media"),
    ],
)
async def test_resource_names_fill_a_result_path(
    provider: tuple[Provider, str],
    gateway: Callable[..., Any],
    output: dict[str, Any],
    sent: str,
) -> None:
    """A final value of several segments (a resource name) fills the result path."""
    fake, upstream = provider
    template = "/v1beta/{final.output.file}:download?alt=media"
    answer, paths = await fetched(fake, upstream, gateway, template, output)
    assert answer.status == 200, await answer.text()
    assert paths == [sent]


async def test_a_url_on_the_upstream_fills_a_result_path(
    provider: tuple[Provider, str], gateway: Callable[..., Any]
) -> None:
    """A URL value on the policy's own upstream is fetched at its path and query."""
    fake, upstream = provider
    uri = f"{upstream}/v1beta/files/v1:download?alt=media"
    answer, paths = await fetched(fake, upstream, gateway, "/{final.output.uri}", {"uri": uri})
    assert answer.status == 200, await answer.text()
    assert paths == ["/v1beta/files/v1:download?alt=media"]


@pytest.mark.parametrize(
    ("template", "output", "why"),
    [
        ("/v1beta/{final.output.file}", {"file": "files/../secrets"}, "'output.file'"),
        ("/v1beta/{final.output.file}", {"file": "files/%2e%2e/x"}, "'output.file'"),
        ("/v1beta/{final.output.file}", {"file": "files//x"}, "'output.file'"),
        ("/v1beta/{final.output.file}", {"file": "files/a?b=c"}, "'output.file'"),
        ("/v1beta/{final.output.file}", {"file": "a\\..\\b"}, "'output.file'"),
        (
            "/{final.output.uri}",
            {"uri": "https://evil.example/v1beta/files/x"},
            "a URL on another origin (https://evil.example)",
        ),
        ("/{final.output.uri}", {"uri": "UPSTREAM/../admin"}, "'output.uri'"),
        ("/{final.output.uri}", {"uri": "UPSTREAM@evil.example/x"}, "another origin"),
    ],
)
async def test_unsafe_final_values_are_refused_clearly(
    provider: tuple[Provider, str],
    gateway: Callable[..., Any],
    template: str,
    output: dict[str, Any],
    why: str,
) -> None:
    """A value that could climb out of the path, smuggle a query, or lead to another host
    is refused with a detail naming it, and nothing is sent."""
    fake, upstream = provider
    output = {k: v.replace("UPSTREAM", upstream) for k, v in output.items()}
    answer, paths = await fetched(fake, upstream, gateway, template, output)
    assert answer.status == 409
    assert why in (await answer.json())["detail"]
    assert paths == []

"""The upstream client and the header/URL rules, against real loopback servers."""

from __future__ import annotations

import asyncio
import gzip
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.errors import UpstreamBodyTooLarge, UpstreamTimeout, UpstreamUnavailable
from gateway.provider.client import Upstream
from gateway.provider.headers import Rewriter, to_provider
from gateway.settings.policy import ProviderPolicy, load_policy

from conftest import Harness

ROOT = Path(__file__).resolve().parents[2]


def bomb(size: int) -> bytes:
    return gzip.compress(b"{" + b" " * size + b"}", compresslevel=9)


async def answer(request: web.Request) -> web.StreamResponse:
    kind = request.match_info["kind"]
    if kind == "bomb":
        return web.Response(body=bomb(50_000_000), headers={"Content-Encoding": "gzip"})
    if kind == "gzip":
        return web.Response(
            body=gzip.compress(b'{"ok": true}'), headers={"Content-Encoding": "gzip"}
        )
    if kind == "deflate":
        return web.Response(
            body=zlib.compress(b'{"ok": 1}'), headers={"Content-Encoding": "deflate"}
        )
    if kind == "redirect":
        raise web.HTTPFound("http://198.51.100.7/elsewhere")
    if kind == "slow":
        await asyncio.sleep(2)
    if kind == "reset":
        assert request.transport is not None
        request.transport.close()
    return web.json_response({"ok": True})


@pytest.fixture
async def origin() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_get("/{kind}", answer)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield str(server.make_url("")).rstrip("/")
    await server.close()


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    client = Upstream(timeout=0.5, max_response_body=1024 * 1024)
    yield client
    await client.close()


async def test_gzip_bomb_is_capped_after_decompression(origin: str, upstream: Upstream) -> None:
    """50 MB of zeros in a ~50 KB gzip body stops at the 1 MiB cap."""
    with pytest.raises(UpstreamBodyTooLarge):
        await upstream.send("GET", f"{origin}/bomb", {})


async def test_compressed_bodies_are_decoded(origin: str, upstream: Upstream) -> None:
    assert (await upstream.send("GET", f"{origin}/gzip", {})).body == b'{"ok": true}'
    assert (await upstream.send("GET", f"{origin}/deflate", {})).body == b'{"ok": 1}'


async def test_redirects_are_never_followed(origin: str, upstream: Upstream) -> None:
    response = await upstream.send("GET", f"{origin}/redirect", {})
    assert response.status == 302


async def test_timeouts_and_resets_are_translated(origin: str, upstream: Upstream) -> None:
    with pytest.raises(UpstreamTimeout):
        await upstream.send("GET", f"{origin}/slow", {})
    with pytest.raises(UpstreamUnavailable):
        await upstream.send("GET", f"{origin}/reset", {})
    with pytest.raises(UpstreamUnavailable) as refused:
        await upstream.send("GET", "http://127.0.0.1:9/none", {})
    assert refused.value.sent is False


async def test_redirect_to_another_host_escalates_the_status_call(harness: Harness) -> None:
    """A 3xx status answer is not followed: integration_failure, and no Location leaks."""
    job = (await (await harness.submit([{"http": 302}])).json())["id"]
    response = await harness.poll_when_due(job)
    assert response.status == 409
    assert "Location" not in response.headers


@pytest.fixture(scope="module")
def policy() -> ProviderPolicy:
    return load_policy(ROOT / "policies/demo-jobs.yaml", "demo", {"DEMO_API_KEY": "k-123456"})


def test_rewriter_maps_upstream_urls_and_drops_others(policy: ProviderPolicy) -> None:
    rewriter = Rewriter(policy, "https://gw.example")
    assert (
        rewriter.url("http://127.0.0.1:8081/v1/jobs/j1")
        == "https://gw.example/p/demo-jobs/v1/jobs/j1"
    )
    assert rewriter.url("/v1/jobs/j1?x=1") == "https://gw.example/p/demo-jobs/v1/jobs/j1?x=1"
    for foreign in (
        "http://127.0.0.1:9999/v1/jobs/j1",
        "https://127.0.0.1:8081/v1/jobs/j1",
        "http://evil.example/v1/jobs/j1",
        "//evil.example/v1",
        "http://user:pw@127.0.0.1:8081/v1",
        "http://127.0.0.1:8081/v1\r\nX: y",
    ):
        assert rewriter.url(foreign) is None, foreign
    body = {"status_url": "http://evil.example/x", "nested": {"u": "/v1/jobs/a"}}
    rewriter.body_fields(body, ["status_url", "nested.u", "missing.field"])
    assert body == {"status_url": None, "nested": {"u": "https://gw.example/p/demo-jobs/v1/jobs/a"}}


def test_response_headers_are_scrubbed(policy: ProviderPolicy) -> None:
    rewriter = Rewriter(policy, "https://gw.example")
    kept = rewriter.response_headers(
        [
            ("Location", "http://evil.example/x"),
            ("Content-Location", "/v1/jobs/j"),
            ("Set-Cookie", "s=1"),
            ("Connection", "close, X-Hop"),
            ("X-Hop", "1"),
            ("Statusgate-Outcome", "succeeded"),
            ("X-Request-Id", "r"),
        ],
        policy,
    )
    assert kept == [
        ("Content-Location", "https://gw.example/p/demo-jobs/v1/jobs/j"),
        ("X-Request-Id", "r"),
    ]


def test_request_headers_lose_agent_credentials(policy: ProviderPolicy) -> None:
    sent = to_provider(
        [
            ("Authorization", "Bearer agent"),
            ("authorization", "Bearer agent2"),
            ("Cookie", "a=b"),
            ("Proxy-Authorization", "x"),
            ("Connection", "keep-alive, X-Private"),
            ("X-Private", "p"),
            ("TE", "trailers"),
            ("Statusgate-Anything", "x"),
            ("Accept", "application/json"),
        ],
        policy,
        "key-1",
    )
    assert sent == {"Accept": "application/json", "Idempotency-Key": "key-1"}

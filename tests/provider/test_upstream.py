"""The upstream client and the header/URL rules, against real loopback servers."""

from __future__ import annotations

import asyncio
import functools
import gzip
import time
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway import UpstreamBodyTooLarge, UpstreamTimeout, UpstreamUnavailable
from gateway.core.models import Clock
from gateway.provider.client import Upstream
from gateway.provider.credentials import OAuth2Credential, Outgoing
from gateway.provider.headers import Rewriter, to_provider
from gateway.settings.policy import Credential, ProviderPolicy, load_policy

from conftest import FakeClock, Harness

ROOT = Path(__file__).resolve().parents[2]


@functools.cache
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
    bomb(50_000_000)  # made before the request: compressing it takes most of the timeout
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


# -- OAuth2 token fetches ------------------------------------------------------------------


@pytest.fixture
async def token_server() -> AsyncIterator[tuple[list[str], str, dict[str, object]]]:
    """A loopback token endpoint: it hangs when told to, else issues a numbered token
    with the ``expires_in`` it is given; every hit is logged."""
    hits: list[str] = []
    setup: dict[str, object] = {"hang": False, "expires_in": 600}

    async def token(request: web.Request) -> web.Response:
        hits.append(request.path)
        if setup["hang"]:
            await asyncio.sleep(30)
        return web.json_response(
            {"access_token": f"token-{len(hits)}", "expires_in": setup["expires_in"]}
        )

    app = web.Application()
    app.router.add_post("/oauth/token", token)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield hits, str(server.make_url("/oauth/token")), setup
    await server.close()


def _oauth2(token_url: str, upstream: Upstream, clock: Clock) -> OAuth2Credential:
    credential = Credential.model_validate(
        {
            "oauth2_client_credentials": {
                "token_url": token_url,
                "client_id": "client-1",
                "client_secret": "secret-1",
            }
        }
    )
    return OAuth2Credential(credential, upstream=upstream, clock=clock)


async def test_a_hanging_token_endpoint_is_fetched_once_for_all_waiting_calls(
    token_server: tuple[list[str], str, dict[str, object]],
) -> None:
    """Eight provider calls needing a token while the token endpoint hangs make one fetch
    and all fail within about one upstream timeout, not one timeout after another."""
    hits, url, setup = token_server
    setup["hang"] = True
    upstream = Upstream(timeout=0.3, max_response_body=1 << 20)
    await upstream.start()
    applier = _oauth2(url, upstream, time.time)
    request = Outgoing("GET", "http://provider.invalid/v1/jobs/1", {}, None)
    try:
        started = asyncio.get_running_loop().time()
        answers = await asyncio.gather(
            *(applier.apply(request) for _ in range(8)),
            return_exceptions=True,
        )
        took = asyncio.get_running_loop().time() - started
        assert all(isinstance(a, UpstreamUnavailable) for a in answers), answers
        assert len(hits) == 1
        assert took < 1.0, took
        setup["hang"] = False
        sent = await applier.apply(request)
        assert sent.headers["Authorization"] == "Bearer token-2"  # the next call fetches anew
    finally:
        await upstream.close()


async def test_a_token_lifetime_under_the_floor_is_not_fetched_per_call(
    token_server: tuple[list[str], str, dict[str, object]],
) -> None:
    """A token endpoint answering ``expires_in: 0.001`` does not make every provider call
    fetch a token: the token is kept for at least MIN_TOKEN_LIFETIME, 30 s (less a margin)."""
    hits, url, setup = token_server
    setup["expires_in"] = 0.001
    clock = FakeClock()
    upstream = Upstream(timeout=2.0, max_response_body=1 << 20)
    await upstream.start()
    applier = _oauth2(url, upstream, clock)
    request = Outgoing("GET", "http://provider.invalid/v1/jobs/1", {}, None)
    try:
        for _ in range(5):
            await applier.apply(request)
            clock.advance(2.0)
        assert len(hits) == 1
        clock.advance(30.0)
        await applier.apply(request)
        assert len(hits) == 2
    finally:
        await upstream.close()

"""Kept results (SPEC 23): a succeeded job's result fetched once, kept in the result store
(a folder or an S3-compatible bucket), and served from there with no provider call, also
after the provider forgot it; too large a result is served through as before; copies go at
their ttl. The gateway is the real app, the provider a real aiohttp double, S3 moto's
server."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestClient
from hypothesis import given
from hypothesis import strategies as st

from gateway.core.models import poll_lease
from gateway.core.results import COPY_BACKOFF, COPY_TRIES, kept_result_path
from gateway.flow import keeping
from gateway.flow.runtime import RUNTIME, Runtime
from gateway.store.results.files import PARTIAL

from conftest import OPERATOR_TOKEN, PROVIDER_ENV, FakeClock
from kept_doubles import (
    AUTH,
    RESULT_TYPE,
    ResultDouble,
    gateway,
    kept_config,
    result_body,
    serve,
    succeeded_job,
)

BUCKET = "kept-results"


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    """moto's S3-compatible server on a free loopback port, with the test bucket."""
    from moto.server import ThreadedMotoServer

    keys = {"AWS_ACCESS_KEY_ID": "testing-key", "AWS_SECRET_ACCESS_KEY": "testing-secret"}
    before = {name: os.environ.get(name) for name in keys}
    os.environ.update(keys)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    import boto3

    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=BUCKET)
    yield endpoint
    server.stop()
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(params=["file", "s3"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """The result store each test runs on: the default folder beside the SQLite file, then
    an S3 bucket (a prefix of the test's own)."""
    if request.param == "file":
        return {"store": f"sqlite:///{tmp_path}/gateway.db"}
    endpoint = request.getfixturevalue("moto_endpoint")
    prefix = tmp_path.name
    return {"results_store": f"s3://{BUCKET}/{prefix}?endpoint={endpoint}&region=us-east-1"}


def runtime_of(client: TestClient[Any, Any]) -> Runtime:
    return client.app[RUNTIME]


async def record(client: TestClient[Any, Any], job: str) -> Any:
    found = await runtime_of(client).store.find("team-a", "demo-jobs", job)
    assert found is not None
    return found


async def copies(client: TestClient[Any, Any]) -> list[str]:
    store = await runtime_of(client).keeper.store()
    return await store.names()


def audit(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / "audit.jsonl").read_text().splitlines()]


async def test_a_kept_result_is_served_after_the_provider_forgot_it(
    tmp_path: Path, target: dict[str, Any]
) -> None:
    """After success the result is fetched once and kept; the result route answers from
    the copy (Statusgate-Result: kept, the provider's content type, no provider call), also
    once the provider answers 404; the record and the audit line carry its size and
    sha256, and its agent-facing path is the result route's."""
    body = result_body(300_000)  # past one 64 KiB chunk, past limits.max_response_body
    double = ResultDouble(body)
    server, upstream = await serve(double)
    clock = FakeClock()
    client = await gateway(kept_config(tmp_path, upstream, **target), clock)
    try:
        job = await succeeded_job(client, clock)
        for _ in range(2):
            answer = await client.get(f"/p/demo-jobs/v1/jobs/{job}/result", headers=AUTH)
            assert answer.status == 200
            assert answer.headers["Statusgate-Result"] == "kept"
            assert answer.headers["Content-Type"] == RESULT_TYPE
            assert answer.headers["Statusgate-Outcome"] == "succeeded"
            assert await answer.read() == body
            double.gone = True
        assert double.result_calls == 1
        stored = await record(client, job)
        kept = stored.kept_result
        assert kept.size == len(body) and kept.sha256 == hashlib.sha256(body).hexdigest()
        assert kept.content_type == RESULT_TYPE and stored.result_fetches == 1
        assert await copies(client) == [kept.name]
        policy = runtime_of(client).settings.policies["demo-jobs"]
        assert kept_result_path(policy, stored) == f"/p/demo-jobs/v1/jobs/{job}/result"
    finally:
        await client.close()
        await server.close()
    lines = [line for line in audit(tmp_path) if line["event"] == "result_kept"]
    assert [(line["size"], line["sha256"]) for line in lines] == [(kept.size, kept.sha256)]
    if "store" in target:  # the default folder: beside the SQLite file
        assert (tmp_path / "gateway.db.results" / kept.name).read_bytes() == body


async def test_twenty_agents_asking_at_once_fetch_the_result_once(tmp_path: Path) -> None:
    """Twenty agents ask for the result while its copy is being made: one provider call,
    and every one of them gets the whole copy."""
    body = result_body(200_000)
    double = ResultDouble(body, pause=0.3)
    server, upstream = await serve(double)
    clock = FakeClock()
    client = await gateway(kept_config(tmp_path, upstream), clock)
    try:
        job = await succeeded_job(client, clock)

        async def ask() -> tuple[int, str | None, bytes]:
            answer = await client.get(f"/p/demo-jobs/v1/jobs/{job}/result", headers=AUTH)
            return answer.status, answer.headers.get("Statusgate-Result"), await answer.read()

        answers = await asyncio.gather(*(ask() for _ in range(20)))
    finally:
        await client.close()
        await server.close()
    assert answers == [(200, "kept", body)] * 20
    assert double.result_calls == 1


async def test_a_copy_is_streamed_on_aiohttps_server_too(tmp_path: Path) -> None:
    """Off the agent lane (aiohttp's own server) the copy is streamed with its length."""
    body = result_body(150_000)
    double = ResultDouble(body)
    server, upstream = await serve(double)
    clock = FakeClock()
    client = await gateway(kept_config(tmp_path, upstream), clock, lane=False)
    try:
        job = await succeeded_job(client, clock)
        answer = await client.get(f"/p/demo-jobs/v1/jobs/{job}/result", headers=AUTH)
        assert answer.status == 200 and answer.headers["Statusgate-Result"] == "kept"
        assert answer.headers["Content-Length"] == str(len(body))
        assert await answer.read() == body
    finally:
        await client.close()
        await server.close()


@pytest.mark.parametrize("chunked", [False, True], ids=["declared", "chunked"])
async def test_a_result_over_max_bytes_is_served_through(
    tmp_path: Path, chunked: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A result larger than results.max_bytes (by its Content-Length, or once read past it)
    is not kept, logged once, and each result call forwards to the provider as before."""
    body = result_body(4096)
    double = ResultDouble(body, chunked=chunked)
    server, upstream = await serve(double)
    clock = FakeClock()
    path = kept_config(tmp_path, upstream, results={"max_bytes": "1KiB"})
    client = await gateway(path, clock)
    try:
        with caplog.at_level(logging.WARNING, logger="statusgate"):
            job = await succeeded_job(client, clock)
            for _ in range(2):
                answer = await client.get(f"/p/demo-jobs/v1/jobs/{job}/result", headers=AUTH)
                assert answer.status == 200 and "Statusgate-Result" not in answer.headers
                assert await answer.read() == body
        stored = await record(client, job)
        assert stored.kept_result is not None and not stored.kept_result.kept
        assert stored.kept_result.size > 1024
        assert await copies(client) == []
    finally:
        await client.close()
        await server.close()
    assert double.result_calls == 3  # the copy tried once, then two calls served through
    logged = [r for r in caplog.records if "larger than results.max_bytes" in r.getMessage()]
    assert len(logged) == 1


async def test_kept_copies_are_deleted_at_their_ttl(tmp_path: Path, target: dict[str, Any]) -> None:
    """A copy past results.ttl (on the injected clock) is deleted by the sweep; the result
    route then forwards as before; a copy still within its ttl stays."""
    double = ResultDouble(result_body(1000))
    server, upstream = await serve(double)
    clock = FakeClock()
    client = await gateway(kept_config(tmp_path, upstream, results={"ttl": "1h"}, **target), clock)
    try:
        old = await succeeded_job(client, clock, "k-old")
        await keeping.settled(runtime_of(client), policy(client), await record(client, old))
        clock.advance(1800)
        young = await succeeded_job(client, clock, "k-young")
        await keeping.settled(runtime_of(client), policy(client), await record(client, young))
        assert len(await copies(client)) == 2
        assert await keeping.delete_expired(runtime_of(client)) == 0
        clock.advance(1801)
        assert await keeping.delete_expired(runtime_of(client)) == 1
        assert await copies(client) == [(await record(client, young)).kept_result.name]
        answer = await client.get(f"/p/demo-jobs/v1/jobs/{old}/result", headers=AUTH)
        assert answer.status == 200 and "Statusgate-Result" not in answer.headers
        assert double.result_calls == 3
        answer = await client.get(f"/p/demo-jobs/v1/jobs/{young}/result", headers=AUTH)
        assert answer.headers["Statusgate-Result"] == "kept" and double.result_calls == 3
    finally:
        await client.close()
        await server.close()


def policy(client: TestClient[Any, Any]) -> Any:
    return runtime_of(client).settings.policies["demo-jobs"]


async def copies_done(client: TestClient[Any, Any]) -> None:
    copying = list(runtime_of(client).keeper.copying.values())
    if copying:
        await asyncio.wait(copying, timeout=30)


@pytest.mark.parametrize("failing", [404, 503, 302])
async def test_failed_copies_back_off_give_up_and_leave_the_budget_to_agents(
    tmp_path: Path, failing: int
) -> None:
    """While the provider's result route fails (404, 5xx, a redirect), the gateway's own
    copy is tried COPY_TRIES times in all, backed off on the clock (the sweeper does not
    try again before), each a result fetch; then it gives up, and once the provider
    recovers the agent's own result calls forward as before, the rest of the budget theirs
    (no 409 result-budget-exhausted)."""
    double = ResultDouble(result_body(1000), failing=failing)
    server, upstream = await serve(double)
    clock = FakeClock()
    client = await gateway(kept_config(tmp_path, upstream), clock)
    runtime = runtime_of(client)
    try:
        job = await succeeded_job(client, clock)
        await copies_done(client)
        assert double.result_calls == 1
        for _ in range(40):  # sweeps without time passing: no try before its backoff
            await keeping.keep_owed(runtime)
            await copies_done(client)
        assert double.result_calls == 1
        for wait in (5, 10, 20, 40, 80):
            clock.advance(wait)
            await keeping.keep_owed(runtime)
            await copies_done(client)
        assert double.result_calls == COPY_TRIES
        stored = await record(client, job)
        assert stored.kept_result is None and stored.copy_attempts == COPY_TRIES
        assert stored.result_fetches == COPY_TRIES
        ops = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
        shown = await client.get(f"/admin/operations/{stored.operation_id}", headers=ops)
        view = (await shown.json())["record"]
        assert view["copy_attempts"] == COPY_TRIES and view["next_copy_at"].endswith("Z")
        double.failing = None
        limit = policy(client).polling.max_result_fetches
        for _ in range(limit - COPY_TRIES):
            answer = await client.get(f"/p/demo-jobs/v1/jobs/{job}/result", headers=AUTH)
            assert answer.status == 200, await answer.text()
            assert "Statusgate-Result" not in answer.headers
            assert await answer.read() == double.body
        assert double.result_calls == limit
    finally:
        await client.close()
        await server.close()


async def test_a_copy_cut_short_leaves_no_copy_and_is_made_again(tmp_path: Path) -> None:
    """A copy whose provider answer breaks off mid-body leaves no copy and no record saying
    kept (the partial file is thrown away); the next result call once the try's backoff is
    over fetches it again, whole."""
    body = result_body(200_000)
    double = ResultDouble(body, break_off=True)
    server, upstream = await serve(double)
    clock = FakeClock()
    path = kept_config(tmp_path, upstream, store=f"sqlite:///{tmp_path}/g.db")
    client = await gateway(path, clock)
    try:
        job = await succeeded_job(client, clock)
        await asyncio.wait_for(double.half_sent.wait(), 30)
        copying = list(runtime_of(client).keeper.copying.values())
        if copying:
            await asyncio.wait(copying, timeout=30)
        assert await copies(client) == []
        stored = await record(client, job)
        assert stored.kept_result is None and stored.result_fetches == 1
        double.break_off = False
        clock.advance(COPY_BACKOFF)
        answer = await client.get(f"/p/demo-jobs/v1/jobs/{job}/result", headers=AUTH)
        assert answer.headers["Statusgate-Result"] == "kept"
        assert await answer.read() == body
        assert double.result_calls == 2
        assert not list((tmp_path / "g.db.results" / PARTIAL).iterdir())
    finally:
        await client.close()
        await server.close()


@given(st.binary(max_size=300), st.lists(st.integers(0, 300), max_size=6))
def test_a_secret_split_between_chunks_is_still_redacted(text: bytes, cuts: list[int]) -> None:
    """However the provider's answer is cut into chunks, the credential never reaches a
    copy, and nothing else changes."""
    secret = b"sk-provider-secret"
    body = text[: len(text) // 2] + secret + text[len(text) // 2 :]
    redactor = keeping.Redactor((secret.decode(),))
    bounds = sorted({0, len(body), *(c for c in cuts if c < len(body))})
    out = b"".join(redactor.feed(body[a:b]) for a, b in itertools.pairwise(bounds))
    out += redactor.end()
    assert out == body.replace(secret, b"[redacted]")


async def test_a_copy_gone_from_the_store_is_forwarded_as_before(tmp_path: Path) -> None:
    """A copy deleted under the gateway (an operator, a lifecycle rule) is no error: the
    result route forwards to the provider as it did before results were kept."""
    double = ResultDouble(result_body(1000))
    server, upstream = await serve(double)
    clock = FakeClock()
    path = kept_config(tmp_path, upstream, store=f"sqlite:///{tmp_path}/g.db")
    client = await gateway(path, clock)
    try:
        job = await succeeded_job(client, clock)
        stored = await keeping.settled(
            runtime_of(client), policy(client), await record(client, job)
        )
        (tmp_path / "g.db.results" / stored.kept_result.name).unlink()
        answer = await client.get(f"/p/demo-jobs/v1/jobs/{job}/result", headers=AUTH)
        assert answer.status == 200 and "Statusgate-Result" not in answer.headers
        assert await answer.read() == double.body and double.result_calls == 2
    finally:
        await client.close()
        await server.close()


async def test_a_reload_that_moves_the_result_store_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """results_store is opened at start (docs/results.md: changing it takes a restart): a
    reload that changes it is refused naming it, not taken while copies go on to the old
    place (on a shared store with none set at start, a folder of the process's own, removed
    when it stops)."""
    for name, value in PROVIDER_ENV.items():  # what a reload reads the policies with
        monkeypatch.setenv(name, value)
    double = ResultDouble(result_body(100))
    server, upstream = await serve(double)
    path = kept_config(tmp_path, upstream, results={"keep": False})
    client = await gateway(path, FakeClock())
    try:
        config = yaml.safe_load(path.read_text())
        config["results_store"] = f"file://{tmp_path / 'elsewhere'}"
        path.write_text(yaml.safe_dump(config))
        ops = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
        answer = await client.post("/admin/reload", headers=ops)
        body = await answer.json()
    finally:
        await client.close()
        await server.close()
    assert answer.status == 422, body
    assert any(
        p.endswith("results_store: cannot change while the gateway runs; restart it to apply")
        for p in body["problems"]
    )


class RunningClock(FakeClock):
    """The injected clock running with the event loop's time (leases expire on it), moved
    on at once by ``advance`` as a FakeClock is."""

    def __init__(self) -> None:
        super().__init__()
        self.started = asyncio.get_running_loop().time()

    def __call__(self) -> float:
        return self.now + asyncio.get_running_loop().time() - self.started

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class SlowResult(ResultDouble):
    """A provider slow to send its result's headers, then slow again before its body: each
    wait under limits.upstream_timeout (each read is bounded by it), both longer than the
    copy's lease together and each longer than a third of it."""

    wait: float = 0.0

    async def result(self, request: web.Request) -> web.StreamResponse:
        self.result_calls += 1
        await asyncio.sleep(self.wait)
        response = web.StreamResponse(headers={"Content-Type": RESULT_TYPE})
        response.content_length = len(self.body)
        await response.prepare(request)  # the headers go at once; no byte of the body yet
        self.half_sent.set()
        await asyncio.sleep(self.wait)
        await response.write(self.body)
        await response.write_eof()
        return response


async def test_a_slow_providers_copy_keeps_its_lease_and_is_fetched_once(tmp_path: Path) -> None:
    """The copy's lease is renewed on a timer while the provider is slow to answer and
    between its chunks, not only when a chunk arrives: a second contender trying for the
    operation's lease the whole time never gets it, and the result is fetched once."""
    double = SlowResult(result_body(100_000))
    double.wait = 4.0  # each under the 6 s timeout, more than a third of it, 8 s together
    server, upstream = await serve(double)
    clock = RunningClock()
    # the copy's lease: 6 s, renewed every 2 s (a loop stalled 4 s by a busy machine: no harm)
    limits = {"upstream_timeout": "6s"}
    client = await gateway(kept_config(tmp_path, upstream, limits=limits), clock)
    runtime = runtime_of(client)
    taken: list[float] = []  # when the contender held the lease of a copy still owed

    async def contend(operation_id: str) -> None:
        name = poll_lease(operation_id)
        while True:
            if await runtime.coordination.acquire_lease(name, "contender", clock(), 6.0):
                found = await runtime.records.get(operation_id)
                if found is not None and found.kept_result is None:
                    taken.append(clock())
                await runtime.coordination.release_lease(name, "contender")
            await asyncio.sleep(0.05)

    try:
        job = await succeeded_job(client, clock)  # its copy starts
        operation_id = (await record(client, job)).operation_id
        contender = asyncio.create_task(contend(operation_id))
        try:
            await asyncio.wait_for(double.half_sent.wait(), 30)
            stored = await keeping.settled(runtime, policy(client), await record(client, job))
        finally:
            contender.cancel()
            await asyncio.wait({contender})
        assert taken == [] and stored.kept_result is not None
        answer = await client.get(f"/p/demo-jobs/v1/jobs/{job}/result", headers=AUTH)
        assert answer.headers["Statusgate-Result"] == "kept"
        assert await answer.read() == double.body
        assert double.result_calls == 1
    finally:
        await client.close()
        await server.close()


async def test_a_copy_whose_lease_is_lost_writes_no_more_and_commits_nothing(
    tmp_path: Path,
) -> None:
    """A process paused past its copy's lease (the clock jumps) while the provider is slow:
    another holder takes the lease; the next renewal finds it gone and the copy is
    abandoned: no copy committed, none recorded, no failure (the new holder makes it)."""
    double = SlowResult(result_body(100_000))
    double.wait = 1.5
    server, upstream = await serve(double)
    clock = RunningClock()
    client = await gateway(
        kept_config(tmp_path, upstream, limits={"upstream_timeout": "3s"}), clock
    )
    runtime = runtime_of(client)
    try:
        job = await succeeded_job(client, clock)
        operation_id = (await record(client, job)).operation_id
        copying = runtime.keeper.copying[operation_id]
        await asyncio.wait_for(double.half_sent.wait(), 30)
        clock.advance(10)  # the lease (3 s) is past on the store's clock
        name = poll_lease(operation_id)
        assert await runtime.coordination.acquire_lease(name, "other", clock(), 60.0)
        await asyncio.wait({copying}, timeout=30)
        assert copying.done() and copying.result() is True
        stored = await record(client, job)
        assert stored.kept_result is None and stored.next_copy_at is None
        assert (stored.copy_attempts, double.result_calls) == (1, 1)
        assert await copies(client) == []
        assert not await runtime.coordination.acquire_lease(name, "third", clock(), 1.0)
    finally:
        await client.close()
        await server.close()

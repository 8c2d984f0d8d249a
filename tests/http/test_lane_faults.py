"""Issue 42, a fault probe of the agent lane through the whole gateway: a client that
half-closes after its status call, idle and slow connections, and the bound on open
connections."""

from __future__ import annotations

import asyncio
from typing import Any

from conftest import AGENT_TOKEN, Harness


def status_call(job: str) -> bytes:
    return (
        f"GET /p/demo-jobs/v1/jobs/{job} HTTP/1.1\r\nHost: gateway.test\r\n"
        f"Authorization: Bearer {AGENT_TOKEN}\r\n\r\n"
    ).encode()


async def test_a_half_closed_agent_gets_the_answer_of_its_forwarded_poll(
    make_harness: Any,
) -> None:
    """A status call followed at once by the client's FIN (``shutdown(SHUT_WR)``, as a
    client that sends a request and then only reads does): the poll is forwarded once, and
    its answer (the provider's status) comes before the connection closes, not an empty
    reply after the provider was paid for."""
    harness: Harness = await make_harness()
    job = (await (await harness.submit([{"state": "running", "delay": 0.2}])).json())["id"]
    record = await harness.record(job)
    harness.clock.now = record.next_poll_at
    server = harness.client.server
    reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(status_call(job))
    writer.write_eof()
    got = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    assert got.startswith(b"HTTP/1.1 200 OK"), got
    assert b'"running"' in got.partition(b"\r\n\r\n")[2]
    assert len(harness.provider_calls(job)) == 1

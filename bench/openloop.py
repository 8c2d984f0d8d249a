"""An open-loop load generator: requests leave on a fixed schedule whatever the answers do,
and latency is measured from each request's scheduled start (no coordinated omission).

Usage: openloop.py [--uvloop] RATE SECONDS URLS_FILE [HEADER: VALUE ...]; prints one JSON
line: the latency percentiles; the rate the answers came back at (``achieved_rps``: answers
over the span from the first to the last, so a server that falls behind shows its own pace);
how late the generator itself sent (``late_p99_ms``: the client's figure, not the server's);
per kind of answer ("200", "503 overloaded", "error") its count and its latency measured
from the moment the request left; and how many connections were opened and how many of
those took SLOW_CONNECT or longer. A request unanswered after TIMEOUT counts as an error, so
a run ends within SECONDS + TIMEOUT. ``--uvloop`` runs the generator on uvloop, which sends
about 1.5x the rate here, for bursts past a server's capacity; the fixed-rate rows keep the
plain loop, so their figures stay comparable with earlier rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import aiohttp
import uvloop

TIMEOUT = aiohttp.ClientTimeout(total=10)
SLOW_CONNECT = 1.0  # seconds: a connection this slow to open had its SYN retried


@dataclass(frozen=True)
class Answer:
    scheduled: float
    sent: float
    done: float
    kind: str  # the status, with the problem slug for problem answers; "error" without one
    connect: float | None  # seconds spent opening a new connection; None: one was reused


def connect_tracing() -> aiohttp.TraceConfig:
    """Times the opening of each new connection into the request's trace context (a dict):
    past a full listen queue the kernel drops the SYN and the client retries it after 1 s,
    a wait that is the server's accept path, not its request handling."""
    tracing = aiohttp.TraceConfig()

    async def started(_: object, context: SimpleNamespace, __: object) -> None:
        context.trace_request_ctx["opening"] = time.perf_counter()

    async def opened(_: object, context: SimpleNamespace, __: object) -> None:
        box = context.trace_request_ctx
        box["connect"] = time.perf_counter() - box["opening"]

    tracing.on_connection_create_start.append(started)
    tracing.on_connection_create_end.append(opened)
    return tracing


async def kind_of(response: aiohttp.ClientResponse) -> str:
    payload = await response.read()
    if response.content_type != "application/problem+json":
        return str(response.status)
    try:
        slug = str(json.loads(payload)["type"]).rsplit("/", 1)[-1]
    except (ValueError, KeyError, TypeError):
        return str(response.status)
    return f"{response.status} {slug}"


async def run(
    rate: float, seconds: float, urls: list[str], headers: dict[str, str]
) -> list[Answer]:
    answers: list[Answer] = []
    total = int(rate * seconds)
    connector = aiohttp.TCPConnector(limit=512)
    tracing = [connect_tracing()]
    async with aiohttp.ClientSession(
        connector=connector, timeout=TIMEOUT, trace_configs=tracing
    ) as http:

        async def one(url: str, scheduled: float) -> None:
            sent, box = time.perf_counter(), dict[str, float]()
            try:
                async with http.get(url, headers=headers, trace_request_ctx=box) as response:
                    kind = await kind_of(response)
            except (TimeoutError, aiohttp.ClientError):
                kind = "error"
            done = time.perf_counter()
            answers.append(Answer(scheduled, sent, done, kind, box.get("connect")))

        start = time.perf_counter() + 0.05
        tasks = []
        for i in range(total):
            scheduled = start + i / rate
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(urls[i % len(urls)], scheduled)))
        await asyncio.gather(*tasks)
    return answers


def pct(values: list[float], p: float) -> float:
    """The p-quantile of sorted seconds, in milliseconds."""
    return values[min(len(values) - 1, int(p * len(values)))] * 1000


def kinds(answers: list[Answer]) -> dict[str, dict[str, float]]:
    """Per kind of answer, the waits from the moment each request left, and the same not
    counting the opening of a new connection (the server's request handling alone)."""
    grouped: dict[str, list[Answer]] = {}
    for answer in answers:
        grouped.setdefault(answer.kind, []).append(answer)
    summary = {}
    for kind, group in sorted(grouped.items()):
        waits = sorted(a.done - a.sent for a in group)
        served = sorted(a.done - a.sent - (a.connect or 0.0) for a in group)
        summary[kind] = {
            "count": len(waits),
            "p50_ms": pct(waits, 0.50),
            "p99_ms": pct(waits, 0.99),
            "max_ms": waits[-1] * 1000,
            "connected_p99_ms": pct(served, 0.99),
            "connected_max_ms": served[-1] * 1000,
        }
    return summary


def summarise(answers: list[Answer]) -> dict[str, Any]:
    latencies = sorted(a.done - a.scheduled for a in answers)
    done = sorted(a.done for a in answers)
    span = done[-1] - done[0]
    errors = sum(a.kind == "error" or a.kind[0] == "5" for a in answers)
    connects = [a.connect for a in answers if a.connect is not None]
    return {
        "sent": len(answers),
        "errors": errors,
        "p50_ms": pct(latencies, 0.50),
        "p99_ms": pct(latencies, 0.99),
        "max_ms": latencies[-1] * 1000,
        "achieved_rps": (len(done) - 1) / span if span > 0 else 0.0,
        "elapsed_s": done[-1] - min(a.scheduled for a in answers),
        "late_p99_ms": pct(sorted(a.sent - a.scheduled for a in answers), 0.99),
        "kinds": kinds(answers),
        "connections": len(connects),
        "slow_connects": sum(c >= SLOW_CONNECT for c in connects),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--uvloop", action="store_true")
    parser.add_argument("rate", type=float)
    parser.add_argument("seconds", type=float)
    parser.add_argument("urls_file")
    parser.add_argument("headers", nargs="*")
    args = parser.parse_args()
    with open(args.urls_file) as handle:
        urls = [line.strip() for line in handle if line.strip()]
    headers = dict(h.split(": ", 1) for h in args.headers)
    if args.uvloop:
        uvloop.install()
    print(json.dumps(summarise(asyncio.run(run(args.rate, args.seconds, urls, headers)))))


if __name__ == "__main__":
    main()

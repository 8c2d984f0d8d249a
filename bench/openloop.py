"""An open-loop load generator: requests leave on a fixed schedule whatever the answers do,
and latency is measured from each request's scheduled start (no coordinated omission).

Usage: openloop.py [--uvloop] RATE SECONDS URLS_FILE [HEADER: VALUE ...]; prints one JSON
line: the latency percentiles; the rate the answers came back at (``achieved_rps``: answers
over the span from the first to the last, so a server that falls behind shows its own pace);
how late the generator itself sent (``late_p99_ms``: the client's figure, not the server's);
and per kind of answer ("200", "503 overloaded", "error") its count and its latency measured
from the moment the request left. A request unanswered after TIMEOUT counts as an error, so
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
from typing import Any

import aiohttp
import uvloop

TIMEOUT = aiohttp.ClientTimeout(total=10)


@dataclass(frozen=True)
class Answer:
    scheduled: float
    sent: float
    done: float
    kind: str  # the status, with the problem slug for problem answers; "error" without one


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
    async with aiohttp.ClientSession(connector=connector, timeout=TIMEOUT) as http:

        async def one(url: str, scheduled: float) -> None:
            sent = time.perf_counter()
            try:
                async with http.get(url, headers=headers) as response:
                    kind = await kind_of(response)
            except (TimeoutError, aiohttp.ClientError):
                kind = "error"
            answers.append(Answer(scheduled, sent, time.perf_counter(), kind))

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
    grouped: dict[str, list[float]] = {}
    for answer in answers:
        grouped.setdefault(answer.kind, []).append(answer.done - answer.sent)
    summary = {}
    for kind, waits in sorted(grouped.items()):
        waits.sort()
        summary[kind] = {
            "count": len(waits),
            "p50_ms": pct(waits, 0.50),
            "p99_ms": pct(waits, 0.99),
            "max_ms": waits[-1] * 1000,
        }
    return summary


def summarise(answers: list[Answer]) -> dict[str, Any]:
    latencies = sorted(a.done - a.scheduled for a in answers)
    done = sorted(a.done for a in answers)
    span = done[-1] - done[0]
    errors = sum(a.kind == "error" or a.kind[0] == "5" for a in answers)
    return {
        "sent": len(answers),
        "errors": errors,
        "p50_ms": pct(latencies, 0.50),
        "p99_ms": pct(latencies, 0.99),
        "max_ms": latencies[-1] * 1000,
        "achieved_rps": (len(done) - 1) / span if span > 0 else 0.0,
        "late_p99_ms": pct(sorted(a.sent - a.scheduled for a in answers), 0.99),
        "kinds": kinds(answers),
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

"""An open-loop load generator: requests leave on a fixed schedule whatever the answers do,
and latency is measured from each request's scheduled start (no coordinated omission).

Usage: openloop.py RATE SECONDS URLS_FILE [HEADER: VALUE ...]; prints one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import aiohttp


async def run(
    rate: float, seconds: float, urls: list[str], headers: dict[str, str]
) -> dict[str, float]:
    latencies: list[float] = []
    errors = 0
    total = int(rate * seconds)
    connector = aiohttp.TCPConnector(limit=512)
    async with aiohttp.ClientSession(connector=connector) as http:

        async def one(url: str, scheduled: float) -> None:
            nonlocal errors
            try:
                async with http.get(url, headers=headers) as response:
                    await response.read()
                    if response.status >= 500:
                        errors += 1
            except aiohttp.ClientError:
                errors += 1
            latencies.append(time.perf_counter() - scheduled)

        start = time.perf_counter() + 0.05
        tasks = []
        for i in range(total):
            scheduled = start + i / rate
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(urls[i % len(urls)], scheduled)))
        await asyncio.gather(*tasks)
    latencies.sort()

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000

    return {"sent": total, "errors": errors, "p50_ms": pct(0.50), "p99_ms": pct(0.99)}


def main() -> None:
    rate, seconds = float(sys.argv[1]), float(sys.argv[2])
    with open(sys.argv[3]) as handle:
        urls = [line.strip() for line in handle if line.strip()]
    headers = dict(h.split(": ", 1) for h in sys.argv[4:])
    print(json.dumps(asyncio.run(run(rate, seconds, urls, headers))))


if __name__ == "__main__":
    main()

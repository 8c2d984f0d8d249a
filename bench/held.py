"""Held waits at scale: N concurrent `Prefer: wait=60` status calls on one gateway process.

Starts the demo provider and a gateway (SQLite), submits one job per 100 held calls whose
next poll is 30 s away, opens N held calls (the gateway holds each on a timer), then measures
the gateway process's resident memory growth per held call, its CPU use while they wait, and
the provider calls made. The calls open at once; those answered 503 overloaded (more in hand
than limits.max_in_flight until they park) retry after Retry-After, as agents' SDKs do.
Prints one block; asserts nothing.

Usage: held.py [N] [WAIT_SECONDS]
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import KEY, PY, TOKEN, bench_policy, free_port, gateway_config, spawn


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def gateway_pid(port: int) -> int:
    """The pid of the gateway process listening on ``port`` (from /proc)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"serve" in command and any(f"gateway-{port}".encode() in c for c in command):
                return int(entry.name)
    raise RuntimeError("gateway process not found")


RETRIES = 5  # 503s a call retries after their Retry-After, as agents' SDKs do


async def hold_all(
    base: str, jobs: list[str], count: int, wait: int, retried: Counter[int], sent: list[float]
) -> dict[int, int]:
    """Open ``count`` held calls at once; how many got each status in the end. A call
    answered ``503 overloaded`` (more calls arrived at once than ``limits.max_in_flight``
    takes before they park) retries after its Retry-After, up to RETRIES times, as the
    agents' SDKs do; ``retried`` counts the calls by how many times they retried, ``sent``
    holds when the last call went out (time.monotonic)."""
    headers = {"Authorization": f"Bearer {TOKEN}", "Prefer": f"wait={wait}"}
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=wait + 30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:

        async def one(n: int) -> int:
            for attempt in range(RETRIES + 1):
                url = f"{base}/v1/jobs/{jobs[n % len(jobs)]}"
                sent[0] = max(sent[0], time.monotonic())
                async with http.get(url, headers=headers) as r:
                    await r.read()
                    after = r.headers.get("Retry-After")
                if r.status != 503 or after is None or attempt == RETRIES:
                    retried[attempt] += 1
                    return r.status
                await asyncio.sleep(float(after))
            raise AssertionError("unreachable")

        statuses = await asyncio.gather(*(one(n) for n in range(count)))
    return dict(Counter(statuses))


async def run(count: int, wait: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        provider_port, port = free_port(), free_port()
        provider = f"http://127.0.0.1:{provider_port}"
        with spawn(
            [PY, "-m", "gateway.run", "demo-provider", "--port", str(provider_port)],
            provider_port,
            {"DEMO_API_KEY": KEY},
        ):
            bench_policy(folder, provider)
            config = gateway_config(folder, port, f"sqlite:///{folder}/held.db", audit=True)
            policy = folder / "policies/bench.yaml"
            policy.write_text(policy.read_text().replace("max_hold: 60s", f"max_hold: {wait}s"))
            with spawn(
                [PY, "-m", "gateway.run", "serve", "--config", str(config)],
                port,
                {"DEMO_API_KEY": KEY},
            ):
                base = f"http://127.0.0.1:{port}/p/bench"
                jobs = await _jobs(base, max(1, count // 100))
                pid = gateway_pid(port)
                before, cpu0 = rss_kib(pid), cpu_seconds(pid)
                retried: Counter[int] = Counter()
                sent = [0.0]
                task = asyncio.create_task(hold_all(base, jobs, count, wait, retried, sent))
                await asyncio.sleep(min(10, wait / 3))  # every call is in and held by now
                during, cpu1, t1 = rss_kib(pid), cpu_seconds(pid), time.monotonic()
                late = sent[0] > t1 - 1.0  # a call still went out a second before the sample
                await asyncio.sleep(min(10, wait / 3))
                cpu2, t2 = cpu_seconds(pid), time.monotonic()
                answered = await task
                calls = await _provider_calls(provider, jobs)
        growth = (during - before) / count
        print(f"Held waits: {count} concurrent Prefer: wait={wait} calls on one gateway process")
        print(f"  resident memory growth per held call: {growth:.1f} KiB [< 32 KB]")
        if late:
            print("  (calls were still coming in when memory was sampled: understated)")
        idle = 100 * (cpu2 - cpu1) / (t2 - t1)
        print(f"  gateway CPU while they wait: {idle:.1f}% of a core [< 5%]")
        shown = ", ".join(f"{n} x {status}" for status, n in sorted(answered.items()))
        print(f"  answers: {shown} (429: the wait ended before the next permitted poll)")
        again = ", ".join(f"{n} after {k}" for k, n in sorted(retried.items()) if k)
        print(
            f"  calls that retried a 503 overloaded after its Retry-After: {again or 'none'}"
            " (all opened at once: past limits.max_in_flight until they park)"
        )
        print(f"  gateway CPU to take them in: {cpu1 - cpu0:.1f} s")
        print(
            f"  provider status calls: {calls} for {len(jobs)} jobs (the schedule allows "
            f"one per job per 30 s poll window)"
        )


async def _jobs(base: str, count: int) -> list[str]:
    """Jobs whose first poll answers pending with a 30 s poll hint."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    ids = []
    async with aiohttp.ClientSession() as http:
        for i in range(count):
            body = {"demo_script": [{"state": "running", "poll_after_seconds": 30}]}
            key = {"Idempotency-Key": f"held-{i}"}
            async with http.post(f"{base}/v1/jobs", json=body, headers={**headers, **key}) as r:
                ids.append((await r.json())["id"])
    return ids


async def _provider_calls(provider: str, jobs: list[str]) -> int:
    async with aiohttp.ClientSession() as http:
        total = 0
        for job in jobs:
            async with http.get(f"{provider}/_demo/log?job={job}") as r:
                total += sum(1 for e in await r.json() if e["method"] == "GET")
    return total


if __name__ == "__main__":
    asyncio.run(
        run(
            int(sys.argv[1]) if len(sys.argv) > 1 else 10_000,
            int(sys.argv[2]) if len(sys.argv) > 2 else 60,
        )
    )

"""Kept results across gateway processes (SPEC 23): a gateway killed mid-copy leaves no
copy anyone is served, and once restarted fetches the result again and serves it whole;
two gateway processes on one Redis fetch a result once, whichever one agents ask.

The gateways are real ``statusgate serve`` processes; the provider is an aiohttp double in
the test's process that streams its result slowly."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import aiohttp

from conftest import PROVIDER_ENV, free_port, start_statusgate, wait_until_up
from kept_doubles import AUTH, ResultDouble, kept_config, result_body, serve

PATIENCE = 60.0  # seconds a step may take on a loaded machine


async def start(config: Path, port: int) -> subprocess.Popen[bytes]:
    process = start_statusgate(["serve", "--config", str(config)], {**os.environ, **PROVIDER_ENV})
    await asyncio.to_thread(wait_until_up, port, process)
    return process


def stopped(process: subprocess.Popen[bytes]) -> str:
    """Stop ``process`` (if it still runs); its stderr, which must hold no traceback."""
    if process.poll() is None:
        process.terminate()
    process.wait(15)
    stderr = process.stderr.read().decode() if process.stderr else ""
    assert "Traceback" not in stderr, stderr
    return stderr


async def succeeded(http: aiohttp.ClientSession, url: str, key: str = "k1") -> str:
    """Submit a job through ``url`` and poll it (as told) until it succeeded."""
    async with http.post(
        f"{url}/p/demo-jobs/v1/jobs", json={}, headers={**AUTH, "Idempotency-Key": key}
    ) as submitted:
        assert submitted.status == 202, await submitted.text()
        job = str((await submitted.json())["id"])
    for _ in range(int(PATIENCE / 0.1)):
        async with http.get(f"{url}/p/demo-jobs/v1/jobs/{job}", headers=AUTH) as polled:
            await polled.read()
            if polled.headers.get("Statusgate-Outcome") == "succeeded":
                return job
        await asyncio.sleep(0.1)
    raise AssertionError(f"{job} never succeeded")


async def result(http: aiohttp.ClientSession, url: str, job: str) -> tuple[int, str | None, bytes]:
    async with http.get(f"{url}/p/demo-jobs/v1/jobs/{job}/result", headers=AUTH) as answer:
        return answer.status, answer.headers.get("Statusgate-Result"), await answer.read()


async def until(check: Any, what: str) -> None:
    for _ in range(int(PATIENCE / 0.05)):
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"waited {PATIENCE}s for {what}")


def audit(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_a_gateway_killed_mid_copy_fetches_again_and_serves_it_whole(
    tmp_path: Path,
) -> None:
    """SIGKILL while the result streams into the store: nothing but a partial file is left
    (no copy, no record saying kept); the restarted gateway fetches the result again and
    serves it complete, with the provider's bytes and sha256."""
    body = result_body(400_000)
    double = ResultDouble(body, hold=asyncio.Event())
    server, upstream = await serve(double)
    port = free_port()
    config = kept_config(
        tmp_path, upstream, store=f"sqlite:///{tmp_path}/g.db", listen={"port": port}
    )
    folder, url = tmp_path / "g.db.results", f"http://127.0.0.1:{port}"
    process = await start(config, port)
    try:
        async with aiohttp.ClientSession() as http:
            job = await succeeded(http, url)
            await asyncio.wait_for(double.half_sent.wait(), PATIENCE)
            partial = folder / ".partial"
            await until(
                lambda: any(p.stat().st_size > 0 for p in partial.glob("*")), "a partial copy"
            )
            os.kill(process.pid, signal.SIGKILL)
            process.wait(15)
            assert [p.name for p in folder.iterdir()] == [".partial"]  # no copy at all
            held, double.hold = double.hold, None
            assert held is not None
            held.set()  # the dead gateway's request ends
            process = await start(config, port)
            status, kept, served = await result(http, url, job)
    finally:
        stopped(process)
        await server.close()
    assert (status, kept) == (200, "kept") and served == body
    assert double.result_calls == 2
    lines = [line for line in audit(tmp_path / "audit.jsonl") if line["event"] == "result_kept"]
    assert [line["sha256"] for line in lines] == [hashlib.sha256(body).hexdigest()]


async def test_two_gateways_on_one_redis_fetch_a_result_once(
    tmp_path: Path, redis_url: str
) -> None:
    """Agents on both replicas ask for a result while one replica copies it: one provider
    call, every agent served the whole copy from the shared folder."""
    body = result_body(300_000)
    double = ResultDouble(body, pause=0.5)
    server, upstream = await serve(double)
    shared = f"file://{tmp_path}/shared"
    ports = [free_port(), free_port()]
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for index, port in enumerate(ports):
            config = kept_config(
                tmp_path / f"r{index}",
                upstream,
                store=redis_url,
                results_store=shared,
                listen={"port": port},
            )
            processes.append(await start(config, port))
        urls = [f"http://127.0.0.1:{port}" for port in ports]
        async with aiohttp.ClientSession() as http:
            job = await succeeded(http, urls[0])
            answers = await asyncio.gather(*(result(http, urls[n % 2], job) for n in range(20)))
    finally:
        for process in processes:
            stopped(process)
        await server.close()
    assert answers == [(200, "kept", body)] * 20
    assert double.result_calls == 1
    assert len(list((tmp_path / "shared").glob("0*"))) == 1

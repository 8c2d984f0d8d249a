"""Edges a review of the whole gateway found: hostile token bytes, `Prefer: wait=0`, a store
that fails after the provider accepted a job, a crash-cut poll met by the deadline sweeper,
two operators cancelling at once, and reloads under `--workers`."""

from __future__ import annotations

import asyncio
import shutil
import signal
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from gateway import StoreError
from gateway.core.models import IdempotencyEntry, OperationRecord
from gateway.demo.provider import DemoProvider
from gateway.flow.runtime import RUNTIME
from gateway.flow.sweep import escalate_overdue
from gateway.observe.metrics import FLUSH_SECONDS
from gateway.store import MemoryStore

from conftest import OPERATOR_TOKEN, Harness, Served, raw

OPS = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}


async def test_token_bytes_that_are_not_utf8_are_401_not_500(harness: Harness) -> None:
    """Bearer, Statusgate-Token and operator tokens with bytes that are not UTF-8 are no
    token at all: 401 on every surface, no traceback."""
    for path, header in [
        ("/p/demo-jobs/v1/jobs/x", b"Authorization: Bearer \xff\xfe"),
        ("/p/demo-jobs/v1/jobs/x", b"Statusgate-Token: \xc3("),
        ("/admin/operations", b"Authorization: Bearer \xff"),
    ]:
        request = (
            f"GET {path} HTTP/1.1\r\nHost: gateway.test\r\n".encode()
            + header
            + b"\r\nConnection: close\r\n\r\n"
        )
        status, body = await raw(harness, request)
        assert status == 401, (path, header, body)


async def test_prefer_wait_0_asks_for_no_wait(harness: Harness) -> None:
    """RFC 7240: wait=0 is an ordinary status call; too early is 429, not a held call."""
    job = (await (await harness.submit([{"state": "running"}])).json())["id"]
    await harness.poll_when_due(job)
    early = await harness.poll(job, headers={"Prefer": "wait=0"})
    assert early.status == 429
    assert "Preference-Applied" not in early.headers


class FailingCreates(MemoryStore):
    """A store that cannot record new operations (its disk is gone, say)."""

    async def create(
        self, record: OperationRecord, idempotency: IdempotencyEntry | None = None
    ) -> OperationRecord:
        raise StoreError("disk full", operation="create")


async def test_a_store_failure_after_the_provider_accepted_is_not_nothing_forwarded(
    make_harness: Any,
) -> None:
    """The job exists at the provider: the agent is told not to resubmit (409
    submission-outcome-unknown), never 503 "nothing was forwarded", and it is audited."""
    harness: Harness = await make_harness(store=FailingCreates())
    answer = await harness.submit([{"state": "running"}])
    assert answer.status == 409, await answer.text()
    body = await answer.json()
    assert body["type"] == "/problems/submission-outcome-unknown"
    assert "Do not resubmit" in body["detail"]
    assert [line["event"] for line in harness.audit_lines()] == ["submit_untracked"]
    retry = await harness.submit([{"state": "running"}])
    assert (await retry.json())["type"] == "/problems/submission-outcome-unknown"
    assert len([e for e in harness.provider.log if e["method"] == "POST"]) == 1


async def test_the_deadline_sweeper_writes_the_line_of_a_poll_cut_by_a_crash(
    harness: Harness,
) -> None:
    """A reservation never answered (the process died) and then the deadline: the sweeper
    escalates and writes the cut request's audit line too."""
    job = (await (await harness.submit([{"state": "running"}])).json())["id"]
    runtime = harness.client.app[RUNTIME]
    record = await harness.record(job)
    cut = record.evolve(status_requests_used=1, inflight_at=record.next_poll_at)
    assert await runtime.store.save(cut)
    harness.clock.now = record.deadline_at + 1
    assert await escalate_overdue(runtime) == 1
    lines = [(line["event"], line["decision"]) for line in harness.audit_lines()]
    assert ("polled", "interrupted") in lines and lines[-1][0] == "escalated"


async def test_two_operators_cancelling_at_once_reach_the_provider_once(
    harness: Harness,
) -> None:
    """The cancel is sent under the operation's poll lease: the second is refused."""
    response = await harness.submit([{"state": "running"}])
    operation = response.headers["Statusgate-Operation"]
    url = f"/admin/operations/{operation}/cancel"
    answers = await asyncio.gather(
        harness.client.post(url, json={"reason": "a"}, headers=OPS),
        harness.client.post(url, json={"reason": "b"}, headers=OPS),
    )
    assert sorted(a.status for a in answers) == [200, 409]
    cancels = [e for e in harness.provider.log if e["path"].endswith("/cancel")]
    assert len(cancels) == 1


async def test_a_reload_reaches_every_worker(
    tmp_path: Path,
    upstream: tuple[DemoProvider, str],
    gateways: list[Served],
    redis_url: str,
) -> None:
    """With --workers 2, POST /admin/reload on one worker reloads them all: every new
    operation afterwards gets the new budget, and both worker processes took some of them
    (each worker's own count of started operations, from its own metric files)."""
    _, url = upstream
    scratch = tmp_path / "tmp"  # the workers' metric files are made under TMPDIR
    scratch.mkdir()
    served = Served(
        tmp_path,
        url,
        tmp_path / "x.db",
        store_url=redis_url,
        args=["--workers", "2"],
        env={"TMPDIR": str(scratch)},
    )
    await served.up()
    gateways.append(served)
    policy = served.folder / "policies" / "demo-jobs.yaml"
    data = yaml.safe_load(policy.read_text())
    data["polling"]["max_status_requests"] = 7
    policy.write_text(yaml.safe_dump(data))
    base = f"http://127.0.0.1:{served.port}"
    agent = {"Authorization": "Bearer agent-token-team-a"}
    # a connection per request: the kernel spreads new connections over both workers
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as http:
        async with http.post(f"{base}/admin/reload", headers=OPS) as r:
            assert r.status == 200, await r.text()
        budgets = set()
        for n in range(30):
            await asyncio.sleep(0.02)
            headers = {**agent, "Idempotency-Key": f"r{n}"}
            async with http.post(f"{base}/p/demo-jobs/v1/jobs", json={}, headers=headers) as r:
                budgets.add(r.headers["Statusgate-Requests-Remaining"])
        assert budgets <= {"7", "12"}
        assert "7" in budgets
        late = budgets  # after the fan-out, no worker answers with the old budget any more
        await asyncio.sleep(2 * FLUSH_SECONDS)  # each worker's counts reach its files
        before = started_by_worker(scratch)
        seen = set()
        for n in range(20):
            headers = {**agent, "Idempotency-Key": f"s{n}"}
            async with http.post(f"{base}/p/demo-jobs/v1/jobs", json={}, headers=headers) as r:
                seen.add(r.headers["Statusgate-Requests-Remaining"])
        await asyncio.sleep(2 * FLUSH_SECONDS)
        after = started_by_worker(scratch)
    assert seen == {"7"}, (late, seen)
    took = {pid: after[pid] - before.get(pid, 0.0) for pid in after}
    assert sum(took.values()) == 20, took
    assert len([pid for pid, count in took.items() if count > 0]) == 2, took
    assert "Traceback" not in served.stop(signal.SIGTERM)


def started_by_worker(scratch: Path) -> dict[str, float]:
    """Operations each worker process has started, by pid: prometheus_client's multiprocess
    mode keeps one counter file per process (``counter_<pid>.db``), read one at a time."""
    [folder] = scratch.glob("statusgate-metrics-*")
    counts: dict[str, float] = {}
    for path in folder.glob("counter_*.db"):
        pid = path.stem.removeprefix("counter_")
        alone = scratch / f"worker-{pid}"
        alone.mkdir(exist_ok=True)
        shutil.copyfile(path, alone / path.name)
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(alone))
        labels = {"provider": "demo-jobs"}
        value = registry.get_sample_value("statusgate_operations_started_total", labels)
        counts[pid] = value or 0.0
    return counts

"""Agents wait without loops: Prefer: wait holds the call; held calls are cheap, end at
shutdown with an answer, and leave nothing behind when the client goes away."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp

from gateway import StoreError
from gateway.flow.runtime import RUNTIME
from gateway.http.prefer import prefer_wait
from gateway.store import MemoryStore

from conftest import AGENT_TOKEN, OTHER_TOKEN, FakeClock, Harness, real_time_harness


def held(wait: int | str) -> dict[str, str]:
    return {"Prefer": f"wait={wait}"}


async def job_of(response: Any) -> str:
    return str((await response.json())["id"])


def test_prefer_parsing() -> None:
    assert prefer_wait(["wait=10"]) == 10
    assert prefer_wait(["respond-async, wait=5"]) == 5
    assert prefer_wait(["handling=lenient", 'WAIT = "7"']) == 7
    assert prefer_wait(["wait=soon", "wait=-1", "wait"]) is None
    assert prefer_wait([]) is None


async def test_one_held_call_gets_the_terminal_answer(harness: Harness) -> None:
    """Prefer: wait=30 on a job that succeeds after 10 s: one call, the terminal answer, and
    the provider sees only the scheduled polls."""
    script = [{"state": "running", "until": 10}, {"state": "succeeded"}]
    job = await job_of(await harness.submit(script))
    started = harness.clock.now
    response = await harness.poll(job, headers=held(30))
    assert response.status == 200
    assert response.headers["Preference-Applied"] == "wait=30"
    assert response.headers["Statusgate-Outcome"] == "succeeded"
    assert (await response.json())["result"] == {"pages": 3}
    assert 10 <= harness.clock.now - started <= 30
    calls = [entry["at"] for entry in harness.provider_calls(job)]
    scheduled = [line for line in harness.audit_lines() if line["event"] in ("submitted", "polled")]
    assert len(calls) == len(scheduled) == (await harness.record(job)).status_requests_used
    for call, line in zip(calls, scheduled, strict=True):
        due = line["next_poll_at"]
        assert call >= _epoch(due) - 0.001, (call, due)
    assert len(calls) <= 5  # 1 s base delay doubling: about 1, 3, 7, 15 s


def _epoch(stamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(stamp).timestamp()


async def test_hold_ends_after_n_seconds_with_the_last_answer(harness: Harness) -> None:
    """Prefer: wait=5 on a job that stays running is held through its pending answers,
    polling whenever the schedule permits, and answered pending only once the next
    permitted poll falls past the 5 seconds: not after the first pending answer, and
    never later than asked."""
    job = await job_of(await harness.submit([{"state": "running"}]))
    started = harness.clock.now
    response = await harness.poll(job, headers=held(5))
    assert response.status == 200
    assert response.headers["Statusgate-Outcome"] == "pending"
    assert response.headers["Preference-Applied"] == "wait=5"
    assert harness.clock.now - started <= 5
    record = await harness.record(job)
    assert record.next_poll_at > started + 5  # held until no further poll fitted
    assert len(harness.provider_calls(job)) == record.status_requests_used >= 2


async def test_hold_too_short_for_the_next_poll_is_too_early(harness: Harness) -> None:
    job = await job_of(
        await harness.submit([{"state": "running"}], submit={"poll_after_seconds": 20})
    )
    response = await harness.poll(job, headers=held(3))
    assert response.status == 429
    assert response.headers["Preference-Applied"] == "wait=3"
    assert harness.provider_calls(job) == []


async def test_hold_is_capped_by_max_hold_and_ends_on_escalation(make_harness: Any) -> None:
    harness: Harness = await make_harness(
        policy_changes={"demo-jobs": {"polling": {"max_hold": "4s"}}}
    )
    job = await job_of(await harness.submit([{"state": "running"}]))
    response = await harness.poll(job, headers=held(600))
    assert response.headers["Preference-Applied"] == "wait=4"
    other = await job_of(await harness.submit([{"state": "running"}, {"state": "bogus"}], key="b"))
    escalated = await harness.poll(other, headers=held(4))
    assert escalated.status == 409
    assert (await escalated.json())["reason"] == "unknown_state"


async def test_fifty_concurrent_calls_make_one_provider_call(harness: Harness) -> None:
    """Step 7 in one process: fifty agents calling at once share one provider call."""
    job = await job_of(await harness.submit([{"state": "running", "delay": 0.3}]))
    harness.clock.now = (await harness.record(job)).next_poll_at
    responses = await asyncio.gather(*(harness.poll(job) for _ in range(50)))
    assert {r.status for r in responses} == {200}
    assert len(harness.provider_calls(job)) == 1


class FailingAnswers(MemoryStore):
    """A store that takes reservations but cannot write a poll's answer."""

    async def finish_poll(self, *args: Any, **kw: Any) -> Any:
        await asyncio.sleep(0.05)  # the others join the poll meanwhile
        raise StoreError("disk gone", operation="finish_poll")


async def test_a_failed_poll_fails_every_caller_that_joined_it(make_harness: Any) -> None:
    """A poll run in its first caller's task that fails (its answer cannot be written)
    fails every caller that joined it with 503 store-unavailable, once, and leaves nothing
    in flight: the next call is answered on its own."""
    harness: Harness = await make_harness(store=FailingAnswers())
    job = await job_of(await harness.submit([{"state": "running", "delay": 0.2}]))
    harness.clock.now = (await harness.record(job)).next_poll_at
    answers = await asyncio.gather(*(harness.poll(job) for _ in range(10)))
    assert [a.status for a in answers] == [503] * 10
    assert {(await a.json())["type"] for a in answers} == {"/problems/store-unavailable"}
    assert len(harness.provider_calls(job)) == 1
    runtime = harness.client.app[RUNTIME]
    assert runtime.inflight == {}
    later = await harness.poll(job)  # answered from the record, joined to no poll gone
    assert later.status == 429 and len(harness.provider_calls(job)) == 1


async def test_client_going_away_leaves_no_task_and_no_lease(tmp_path: Path) -> None:
    """A held call whose client disconnects, mid-poll or mid-wait, leaves no task running
    and no lease held; the poll it had started still completes and is recorded."""
    polling = {"base_delay": "100ms"}
    async with real_time_harness(
        tmp_path, policy_changes={"demo-jobs": {"polling": polling}}
    ) as harness:
        job = await job_of(await harness.submit([{"state": "running", "delay": 0.4}]))
        await asyncio.sleep(0.15)
        url = harness.client.make_url(f"/p/demo-jobs/v1/jobs/{job}")
        headers = {"Authorization": f"Bearer {AGENT_TOKEN}", **held(30)}
        async with aiohttp.ClientSession() as agent:
            call = asyncio.create_task(agent.get(url, headers=headers))
            while not harness.provider_calls(job):
                await asyncio.sleep(0.01)
            call.cancel()  # the agent gives up mid-poll and closes its connection
        await asyncio.sleep(0.6)
        runtime = harness.client.app[RUNTIME]
        assert runtime.inflight == {}
        record = await harness.record(job)
        assert record.status_requests_used == 1 and record.last_known_state == "running"
        assert await runtime.store.acquire_lease(
            f"poll:{record.operation_id}", "probe", time.time(), 1
        )
        await runtime.store.release_lease(f"poll:{record.operation_id}", "probe")
        assert runtime.holding == 0
        # the same while the held call waits for its next poll (or makes it: a poll in
        # progress ends first, the handler's cancel waits for it, 0.4 s at most here)
        async with aiohttp.ClientSession() as agent:
            call = asyncio.create_task(agent.get(url, headers=headers))
            await asyncio.sleep(0.2)
            call.cancel()
            assert runtime.holding == 1
        for _ in range(60):
            if runtime.holding == 0:
                break
            await asyncio.sleep(0.01)
        assert runtime.holding == 0 and runtime.inflight == {}


async def test_held_calls_are_answered_at_shutdown(tmp_path: Path) -> None:
    async with real_time_harness(tmp_path) as harness:
        job = await job_of(
            await harness.submit([{"state": "running"}], submit={"poll_after_seconds": 60})
        )
        held_calls = [asyncio.create_task(harness.poll(job, headers=held(50))) for _ in range(3)]
        await asyncio.sleep(0.2)
        started = time.perf_counter()
        await harness.client.app.shutdown()
        answers = await asyncio.wait_for(asyncio.gather(*held_calls), 2)
        assert time.perf_counter() - started < 1.0
        for answer in answers:
            assert answer.status == 429
            assert answer.headers["Preference-Applied"] == "wait=50"
            assert "Retry-After" in answer.headers


async def test_early_call_held_past_an_early_wake_up_gets_the_poll(
    make_harness: Any, clock: FakeClock
) -> None:
    """With ``early_calls: hold``, a held call whose timer fires a few milliseconds before
    the next permitted poll waits again and answers with that poll, never 429 too-early."""
    on_time = clock.sleep

    async def early(seconds: float) -> None:  # timer and clock granularity, under load
        await on_time(max(0.0, seconds - 0.003))

    clock.sleep = early  # type: ignore[method-assign]
    polling = {"early_calls": "hold", "jitter": {"min": 1, "max": 1}}
    harness: Harness = await make_harness(policy_changes={"demo-jobs": {"polling": polling}})
    job = await job_of(await harness.submit([{"state": "running"}]))
    for polls in (1, 2):
        due = (await harness.record(job)).next_poll_at
        assert harness.clock.now < due
        answer = await harness.poll(job)  # too early: held until the next poll
        assert answer.status == 200, await answer.text()
        assert (await answer.json())["state"] == "running"
        assert harness.clock.now >= due
        assert len(harness.provider_calls(job)) == polls


async def until(condition: Any) -> None:
    """Wait (bounded) for a condition on the gateway's own counters, which have no event."""
    async with asyncio.timeout(5):
        while not condition():
            await asyncio.sleep(0.005)


async def test_held_calls_past_the_bounds_are_answered_at_once(
    make_harness: Any, clock: FakeClock
) -> None:
    """With ``limits.max_held_per_account: 2`` and ``max_held: 3``, an account's third held
    call and any call past three held in all are answered at once as without ``Prefer:
    wait`` (429 too-early with Retry-After, no Preference-Applied, nothing sent), counted in
    ``statusgate_holds_declined_total`` by bound; the calls within the bounds stay held and
    get their poll, and once they end a held call is held again."""
    gate = asyncio.Event()
    on_time = clock.sleep

    async def parked(seconds: float) -> None:  # held calls stay parked until the gate opens
        await gate.wait()
        await on_time(seconds)

    clock.sleep = parked  # type: ignore[method-assign]
    limits = {"max_held": 3, "max_held_per_account": 2}
    harness: Harness = await make_harness(config_changes={"limits": limits})
    runtime = harness.client.app[RUNTIME]
    script = [{"state": "running"}, {"state": "succeeded"}]
    mine = await job_of(await harness.submit(script))
    theirs = await job_of(await harness.submit(script, key="b", token=OTHER_TOKEN))
    holds = []
    for n, (job, token) in enumerate([(mine, AGENT_TOKEN), (mine, AGENT_TOKEN)], 1):
        holds.append(asyncio.create_task(harness.poll(job, headers=held(30), token=token)))
        await until(lambda n=n: runtime.parked == n)
    async with asyncio.timeout(5):  # answered at once, not parked behind the gate
        past_mine = await harness.poll(mine, headers=held(30))
    holds.append(asyncio.create_task(harness.poll(theirs, headers=held(30), token=OTHER_TOKEN)))
    await until(lambda: runtime.parked == 3)
    async with asyncio.timeout(5):
        past_all = await harness.poll(theirs, headers=held(30), token=OTHER_TOKEN)
    for answer in (past_mine, past_all):
        assert answer.status == 429, await answer.text()
        assert (await answer.json())["type"] == "/problems/too-early"
        assert "Retry-After" in answer.headers and "Preference-Applied" not in answer.headers
    assert harness.provider_calls(mine) == harness.provider_calls(theirs) == []
    assert not any(task.done() for task in holds) and runtime.holding == 3
    scrape = await (await harness.client.get("/metrics")).text()
    for bound in ("account", "total"):
        series = f'statusgate_holds_declined_total{{bound="{bound}",provider="demo-jobs"}} 1.0'
        assert series in scrape, scrape

    gate.set()
    for answer in await asyncio.gather(*holds):
        assert answer.status == 200 and answer.headers["Preference-Applied"] == "wait=30"
        assert answer.headers["Statusgate-Outcome"] == "succeeded"
    assert runtime.holding == 0
    again = await job_of(await harness.submit([{"state": "running"}], key="c"))
    answer = await harness.poll(again, headers=held(30))
    assert answer.status == 200 and answer.headers["Preference-Applied"] == "wait=30"
    assert len(harness.provider_calls(again)) >= 1

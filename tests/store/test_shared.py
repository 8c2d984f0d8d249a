"""The shared stores' common layer (gateway/store/shared.py) on injected clocks: the clock
sync's order, what a slow or failed sync keeps, the turn queue's bound and the read batch."""

from __future__ import annotations

import asyncio

import pytest

from gateway.errors import StoreError
from gateway.store.shared import Batch, SharedClock, TurnQueue


class FakeTime:
    """A local clock that moves only when a reading of the store's clock takes time."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.events: list[str] = []
        self.ahead = 5.0  # the store's clock minus this one
        self.trip = 0.002  # each reading's round trip
        self.broken = False
        self.second_sleep = asyncio.Event()

    def local(self) -> float:
        return self.now

    async def read(self) -> float:
        self.events.append("read")
        if self.broken:
            raise StoreError("time: down", operation="time")
        self.now += self.trip / 2
        theirs = self.now + self.ahead
        self.now += self.trip / 2
        return theirs

    async def sleep(self, seconds: float) -> None:
        self.events.append(f"sleep {seconds:g}")
        if self.events.count(f"sleep {seconds:g}") >= 2:
            self.second_sleep.set()
            await asyncio.Event().wait()  # the test ends here


async def test_the_clock_syncs_at_start_then_sleeps_before_each_resync() -> None:
    """start() measures the offset before returning (the first decisions are on the store's
    clock); the background loop then sleeps first and syncs after, so start is not followed
    by a second, redundant sync."""
    fake = FakeTime()
    clock = SharedClock(fake.read, local=fake.local, sleep=fake.sleep, resync=10.0)
    await clock.start()
    assert fake.events == ["read"] * 3
    assert clock.now() == pytest.approx(fake.now + 5.0)
    fake.ahead = 7.0
    await asyncio.wait_for(fake.second_sleep.wait(), 60)
    await clock.close()
    assert fake.events == ["read"] * 3 + ["sleep 10"] + ["read"] * 3 + ["sleep 10"]
    assert clock.now() == pytest.approx(fake.now + 7.0)


async def test_a_slow_or_failed_sync_keeps_the_offset_there_was() -> None:
    """A sync whose quickest reading took longer than CLOCK_TRIP, or that failed, leaves the
    offset as it was; the very first sync is taken however slow (nothing better is known)."""
    fake = FakeTime()
    fake.trip = 0.5
    clock = SharedClock(fake.read, local=fake.local, sleep=fake.sleep)
    await clock.sync()
    assert clock.offset == pytest.approx(5.0)
    fake.ahead = 9.0
    await clock.sync()
    assert clock.offset == pytest.approx(5.0)
    fake.broken = True
    await clock.start()  # the failure is swallowed: the store fails closed elsewhere
    await clock.close()
    assert clock.offset == pytest.approx(5.0)


def test_the_turn_queue_refuses_past_its_bound_unless_alone() -> None:
    """Past the bound a call is refused at once with the backend's error; a call alone goes
    whatever its size; take() empties the queue and its count."""
    queue: TurnQueue[str] = TurnQueue(4, lambda count: OverflowError(f"{count} waiting"))
    assert queue.put("big", 9) is True  # alone: any size
    with pytest.raises(OverflowError, match="9 waiting"):
        queue.put("more", 1)
    assert queue.take() == ["big"] and not queue and queue.count == 0
    assert queue.put("a", 2) is True
    assert queue.put("b", 2) is False
    assert queue.count == 4


async def test_a_batch_fetches_each_key_once_per_turn_and_shares_failures() -> None:
    """Reads asked in one turn go as one fetch with each key once; callers of the same key
    share its answer; a failed fetch reaches every caller of that batch."""
    fetched: list[list[str]] = []

    async def fetch(keys: list[str]) -> dict[str, int]:
        fetched.append(keys)
        if "bad" in keys:
            raise StoreError("get: down", operation="get")
        return {key: len(key) for key in keys}

    batch: Batch[str, int] = Batch(fetch)
    answers = await asyncio.gather(batch.ask("a"), batch.ask("bb"), batch.ask("a"))
    assert answers == [1, 2, 1]
    assert fetched == [["a", "bb"]]
    failing = [batch.ask("bad"), batch.ask("c")]
    results = await asyncio.gather(*failing, return_exceptions=True)
    assert all(isinstance(result, StoreError) for result in results)

"""The shared stores' common layer (gateway/store/shared.py) on injected clocks: the clock
sync's order, what a slow or failed sync keeps, the turn queue's bound and the read batch."""

from __future__ import annotations

import asyncio

import pytest

from gateway import StoreError
from gateway.store.shared import (
    CLOCK_RETRY,
    CLOCK_START_TRIES,
    Batch,
    SharedClock,
    TurnQueue,
)


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


async def test_a_slower_or_failed_sync_keeps_the_offset_there_was() -> None:
    """A sync whose quickest reading took longer than CLOCK_TRIP and than the reading in use
    leaves the offset as it was, as does a failed one; the very first is taken however slow
    (nothing better is known)."""
    fake = FakeTime()
    fake.trip = 0.5
    clock = SharedClock(fake.read, local=fake.local, sleep=fake.sleep)
    await clock.sync()
    assert clock.offset == pytest.approx(5.0) and clock.synced and not clock.settled
    fake.ahead, fake.trip = 9.0, 0.6
    await clock.sync()
    assert clock.offset == pytest.approx(5.0)
    fake.broken = True
    await clock.start()  # the failure is swallowed: the store fails closed elsewhere
    await clock.close()
    assert clock.offset == pytest.approx(5.0)


class SlowThenQuick(FakeTime):
    """A store whose first ``slow`` readings wait behind a busy event loop: the answer is
    read ``late`` seconds after the store gave it (the reading looks ``late / 2`` behind)."""

    def __init__(self, slow: int, late: float) -> None:
        super().__init__()
        self.ahead, self.slow, self.late = 0.0, slow, late

    async def read(self) -> float:
        self.events.append("read")
        theirs = self.now + 0.001
        self.now += 0.002 + (self.late if self.slow > 0 else 0.0)
        self.slow -= 1
        return theirs

    async def sleep(self, seconds: float) -> None:
        self.events.append(f"sleep {seconds:g}")
        self.now += seconds
        if len([e for e in self.events if e.startswith("sleep")]) >= 3:
            self.second_sleep.set()
            await asyncio.Event().wait()


async def test_a_slow_first_reading_at_start_is_replaced_before_traffic_not_at_resync() -> None:
    """A replica that starts under load reads the store's clock late: kept for the 10 s of a
    resync, its clock ran 3 s behind, then jumped forward at once and its own poll lease
    looked expired (CI: two provider polls 9 ms apart). Start measures again until a reading
    is within CLOCK_TRIP; when none is, the loop retries every CLOCK_RETRY seconds; a
    reading quicker than the one in use replaces it."""
    fake = SlowThenQuick(slow=6, late=6.0)  # start's first two syncs (3 readings each) slow
    clock = SharedClock(fake.read, local=fake.local, sleep=fake.sleep, resync=10.0)
    await clock.start()
    assert fake.events == ["read"] * 9
    assert clock.settled and clock.now() == pytest.approx(fake.now, abs=0.002)

    stuck = SlowThenQuick(slow=10**6, late=6.0)  # every reading at start is slow
    clock = SharedClock(stuck.read, local=stuck.local, sleep=stuck.sleep, resync=10.0)
    await clock.start()
    assert stuck.events == ["read"] * 3 * CLOCK_START_TRIES and not clock.settled
    assert clock.now() == pytest.approx(stuck.now - 3.0, abs=0.01)  # the best known
    stuck.slow = 0
    await asyncio.wait_for(stuck.second_sleep.wait(), 60)
    await clock.close()
    sleeps = [e for e in stuck.events if e.startswith("sleep")]
    assert sleeps == [f"sleep {CLOCK_RETRY:g}", "sleep 10", "sleep 10"]
    assert clock.settled and clock.now() == pytest.approx(stuck.now, abs=0.002)


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

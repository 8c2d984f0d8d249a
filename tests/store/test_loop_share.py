"""The loop thread's CPU share, as the SQLite store's group commit reads it
(gateway/store/sqlite/loop_share.py): pure arithmetic on the two clocks it is told."""

from __future__ import annotations

from gateway.store.sqlite.loop_share import SHARE, WINDOW, LoopShare


def test_busy_from_the_cpu_share_of_each_window() -> None:
    """A window ends at the first reading WINDOW or more after it began; the loop is busy
    while the last ended window's CPU share is SHARE or more; readings inside a window
    change nothing; an idle spell ends busy at its first reading."""
    load = LoopShare()
    load.seen(0.0, 0.0)
    assert not load.busy  # idle until told twice
    load.seen(WINDOW / 2, WINDOW / 2)
    assert not load.busy  # the window has not ended
    load.seen(WINDOW, 1.01 * SHARE * WINDOW)
    assert load.busy  # a little more than SHARE of the window on the CPU
    cpu = 1.01 * SHARE * WINDOW
    load.seen(1.5 * WINDOW, cpu)
    assert load.busy  # inside the next window: the last measure holds
    load.seen(3 * WINDOW, cpu + 0.99 * SHARE * 2 * WINDOW)
    assert not load.busy  # a little less than SHARE over a window twice as long
    cpu += 0.99 * SHARE * 2 * WINDOW
    load.seen(3 * WINDOW + 1.01 * WINDOW, cpu + WINDOW)
    assert load.busy  # all of a window
    load.seen(3 * WINDOW + 60.0, cpu + WINDOW + 0.001)
    assert not load.busy  # a long idle spell

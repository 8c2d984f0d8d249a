"""Several replicas' audit lines told as one story (core/story.py): pure."""

from __future__ import annotations

from gateway.core.story import Entry, merged, readable, tell, told, unreadable_note


def line(seq: int, at: str, event: str = "resumed") -> dict[str, object]:
    return {"seq": seq, "at": f"2026-12-01T10:00:{at}Z", "event": event, "actor": "alice"}


def test_lines_of_several_replicas_merge_in_time_order_each_named_once() -> None:
    """Lines merge by instant (then replica, then seq); a line seen in a replica's file and
    in the store's copy counts once; two chains of one replica's name are told apart by
    their chain's first digits; unnamed, the story is the lines alone."""
    a1 = Entry("gw-a", "aaaaaaaa11111111", 1, line(1, "01.000"))
    a2 = Entry("gw-a", "aaaaaaaa11111111", 2, line(2, "03.000"))
    b1 = Entry("gw-b", "bbbbbbbb22222222", 1, line(1, "02.000"))
    again = Entry("gw-b", "cccccccc33333333", 7, line(7, "03.000"))
    entries = merged([a2, b1, a1, a1, again])
    assert entries == [a1, b1, a2, again]
    assert told(entries, named=True) == [
        "10:00:01 resumed by alice (replica gw-a)",
        "10:00:02 resumed by alice (replica gw-b/bbbbbbbb)",
        "10:00:03 resumed by alice (replica gw-a)",
        "10:00:03 resumed by alice (replica gw-b/cccccccc)",
    ]
    assert told(entries, named=False)[0] == "10:00:01 resumed by alice"


def test_only_lines_with_a_seq_an_instant_and_an_event_are_told() -> None:
    """A line read back may be altered: it is told only with a whole-number seq and text
    ``at`` and ``event``; a told line's other members may have any type; the note counts
    what was left out."""
    assert readable(line(1, "01.000"))
    for bad in ({**line(1, "01.000"), "seq": "1"}, {**line(1, "01.000"), "seq": True}):
        assert not readable(bad)
    assert not readable({"seq": 1, "at": 5, "event": "polled"})
    assert not readable({"seq": 1, "at": "2026-12-01T10:00:00Z"})
    assert not readable(["seq", 1])
    odd = {**line(1, "01.000", "polled"), "http_status": "200", "next_poll_at": 7}
    assert tell(odd) == "10:00:01 received 200, next poll --:--:-- from local_backoff"
    assert unreadable_note(0) is None
    assert unreadable_note(1) == "1 line unreadable (left out)"
    assert unreadable_note(3) == "3 lines unreadable (left out)"

"""The bench's verdicts and summaries, on made-up figures: nothing here measures or times."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

BENCH = Path(__file__).resolve().parent.parent / "bench"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while defining
    spec.loader.exec_module(module)
    return module


targets = load("targets")
openloop = load("openloop")


def test_a_ratio_over_its_stretch_is_met_with_the_stretch() -> None:
    """A figure past the stretch says so; between target and stretch it is only met."""
    assert targets.Target("r", 0.55, ">=", 0.4, 0.5).verdict() == "met, stretch too"
    assert targets.Target("r", 0.45, ">=", 0.4, 0.5).verdict() == "met"
    assert targets.Target("r", 0.3, ">=", 0.4, 0.5).verdict() == "MISSED"


def test_a_latency_bound_is_an_upper_one_and_a_strict_one_excludes_the_bound() -> None:
    """An at-most bound admits the bound itself, a strict one does not; a figure this run did
    not measure gets no verdict."""
    assert targets.Target("p", 5.0, "<=", 5.0, unit="ms").verdict() == "met"
    assert targets.Target("p", 50.0, "<", 50.0, unit="ms").verdict() == "MISSED"
    line = targets.Target("p", None, "<=", 5.0, 2.0, unit="ms").line()
    assert "n/a" in line and "not measured" in line and "stretch 2 ms" in line


def test_the_issue_23_lines_cover_every_target_even_without_the_figures() -> None:
    """With nothing measured, every target still has its line, and the overload step says
    why it did not run."""
    lines = targets.issue_23({}, {}, {}, {"skipped": "limits.max_in_flight: unknown key"})
    shown = [t.what for t in lines if isinstance(t, targets.Target)]
    assert len(shown) == 6  # two ratios, added p50 and p99, G2's ratio and its p99
    assert lines[-1] == "G2 past its in-flight bound: skipped: limits.max_in_flight: unknown key"


def burst(kinds: dict[str, dict[str, float]]) -> dict[str, Any]:
    sent = int(sum(k["count"] for k in kinds.values()))
    return {
        "kinds": kinds,
        "sent": sent,
        "rate": 3000.0,
        "seconds": 2.0,
        "bound": 32,
        "busy": 0.97,
        "late_p99_ms": 4.0,
        "connections": 512,
        "slow_connects": 3,
    }


def kind(count: int, p99: float, longest: float) -> dict[str, float]:
    return {
        "count": count,
        "p50_ms": p99 / 2,
        "p99_ms": p99,
        "max_ms": longest,
        "connected_p99_ms": p99,
        "connected_max_ms": longest,
    }


def test_past_the_bound_the_longest_wait_is_over_every_kind_of_answer() -> None:
    """The 503s' p99 is judged on the 503s alone; the longest wait on every caller's."""
    lines = targets.past_the_bound(
        burst({"200": kind(10, 30, 1200), "503 overloaded": kind(90, 8, 20)})
    )
    refused, longest = lines[1], lines[2]
    assert (refused.figure, refused.verdict()) == (8, "met")
    assert (longest.figure, longest.verdict()) == (1200, "MISSED")
    assert "90% 503 overloaded" in lines[0]


def test_the_answers_pace_is_their_count_over_their_own_span() -> None:
    """A server that answers 11 requests over 2 s kept a pace of 5/s, whatever was offered."""
    answers = [openloop.Answer(i * 0.1, i * 0.1, i * 0.2 + 0.01, "200", None) for i in range(11)]
    summary = openloop.summarise(answers)
    assert round(summary["achieved_rps"], 6) == 5.0
    assert summary["kinds"]["200"]["count"] == 11


def test_the_wait_once_connected_leaves_out_opening_the_connection() -> None:
    """A request that spent 1.2 s of its 1.25 s opening a connection was served in 50 ms,
    and counts as a slow connect."""
    summary = openloop.summarise([openloop.Answer(0.0, 0.0, 1.25, "503 overloaded", 1.2)])
    refused = summary["kinds"]["503 overloaded"]
    assert round(refused["max_ms"]) == 1250 and round(refused["connected_max_ms"]) == 50
    assert (summary["connections"], summary["slow_connects"]) == (1, 1)


def test_a_ratio_target_is_the_median_of_its_interleaved_rounds() -> None:
    """Where the run has interleaved rounds of a ratio, the verdict is on their median (the
    rounds and the single runs' ratio shown beside); without rounds, on the single runs."""

    class Row:
        def __init__(self, rps: float) -> None:
            self.rps, self.p50, self.p99 = rps, 0.0, 0.0

    rows = {(targets.G1, targets.FWD): Row(300.0), (targets.B2, targets.FWD): Row(1000.0)}
    what = "G1 forwarded / B2 forwarded"
    rounds = {what: [0.47, 0.41, 0.44]}
    ruled = targets.ratio_target(
        what, rows, (targets.G1, targets.FWD), (targets.B2, targets.FWD), rounds, 0.4, 0.5
    )
    assert ruled.figure == 0.44 and ruled.verdict() == "met"
    assert (
        ruled.beside
        == "median of 3 interleaved rounds: 0.41, 0.44, 0.47; the single runs above: 0.30x"
    )
    single = targets.issue_23(rows, {}, {}, {"skipped": "no Redis"})[0]
    assert isinstance(single, targets.Target)
    assert single.figure == 0.3 and single.verdict() == "MISSED" and single.beside == ""
    even = targets.issue_24({}, {}, {}, {"G3 forwarded / G1 forwarded": [0.7, 0.9]})[0]
    assert isinstance(even, targets.Target) and even.figure == 0.8 and even.verdict() == "met"


class Latency:
    def __init__(self, rps: float, p50: float, p99: float) -> None:
        self.rps, self.p50, self.p99 = rps, p50, p99


def test_the_added_latency_is_the_median_of_the_rounds_differences() -> None:
    """Each round's G1 figure less B0's of the same round, at that round's rate; the verdict
    on their median, every round shown beside; without rounds, the single runs'."""
    rounds = {
        targets.G1: [Latency(900, 4.0, 20.0), Latency(600, 9.0, 40.0), Latency(800, 5.5, 30.0)],
        targets.B0: [Latency(900, 1.0, 2.0), Latency(600, 1.0, 3.0), Latency(800, 1.5, 2.0)],
    }
    p50, p99 = targets.added_latency({}, {}, rounds)
    assert (p50.figure, p50.verdict()) == (4.0, "met")
    assert p50.beside == "median of 3 rounds: 3.0 at 900/s, 8.0 at 600/s, 4.0 at 800/s"
    assert (p99.figure, p99.verdict()) == (28.0, "MISSED")
    single = {targets.G1: Latency(900, 7.0, 9.0), targets.B0: Latency(900, 1.0, 2.0)}
    assert targets.added_latency(single, {}, {})[0].figure == 6.0


def test_a_stores_open_loop_p99_is_the_median_of_its_rounds() -> None:
    """The p99 target is judged on the median round, the rounds listed beside."""
    rounds = {targets.G3: [Latency(500, 5, 150.0), Latency(510, 5, 40.0), Latency(490, 5, 60.0)]}
    judged = targets.open_p99(targets.G3, {}, {}, 100.0, None, rounds)
    assert (judged.figure, judged.verdict()) == (60.0, "met")
    assert judged.beside.startswith("median of 3 rounds: 150.0 at 500/s, 40.0 at 510/s")

"""The targets of the open issues beside the figures of one `make bench` run: each line the
figure, the target, the stretch target where the issue gives one, and met or MISSED.

Pure: reads the figures run.py measured and returns lines; measures nothing, asserts
nothing (no test asserts a timing either: the verdicts are for the reader of one run).
"""

from __future__ import annotations

import operator
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

G1, G2, G3 = "G1 Statusgate SQLite", "G2 Statusgate Redis", "G3 Statusgate PostgreSQL"
B0, B2 = "B0 provider", "B2 bare proxy"
B3 = ("B3 aiohttp floor", "fixed answer")
FWD, EARLY = "forwarded poll", "too-early refusal"
OVERLOADED = "503 overloaded"
RULES: Mapping[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    "<": operator.lt,
}


class Measured(Protocol):
    rps: float
    p50: float
    p99: float


Rows = Mapping[tuple[str, str], Measured]
Latencies = Mapping[str, Measured]
# target -> its fixed-rate latency in each round, each at 60% of the closed-loop capacity
# measured just before it in that round; B0's rounds are at G1's rate of the same round
LatencyRounds = Mapping[str, list[Measured]]


@dataclass(frozen=True)
class Target:
    """One target beside its figure; figure None when this run did not measure it."""

    what: str
    figure: float | None
    rule: str  # a key of RULES: the figure must stand in this relation to the bound
    bound: float
    stretch: float | None = None
    unit: str = "x"  # "x" for a ratio, else the unit of a latency
    beside: str = ""  # another measure of the same thing, shown after the verdict

    def shown(self, value: float, bound: bool = False) -> str:
        if self.unit == "x":
            return f"{value:.2f}x"
        return f"{value:g} {self.unit}" if bound else f"{value:.1f} {self.unit}"

    def verdict(self) -> str:
        if self.figure is None:
            return "not measured"
        met = RULES[self.rule]
        if not met(self.figure, self.bound):
            return "MISSED"
        if self.stretch is not None and met(self.figure, self.stretch):
            return "met, stretch too"
        return "met"

    def line(self) -> str:
        aim = f"{self.rule} {self.shown(self.bound, bound=True)}"
        if self.stretch is not None:
            aim += f", stretch {self.shown(self.stretch, bound=True)}"
        figure = "n/a" if self.figure is None else self.shown(self.figure)
        text = f"  {self.what:<50} {figure:>10}  {'[' + aim + ']':<28} {self.verdict()}"
        return f"{text}\n      ({self.beside})" if self.beside else text


def ratio(rows: Rows, a: tuple[str, str], b: tuple[str, str]) -> float | None:
    return rows[a].rps / rows[b].rps if a in rows and b in rows else None


Rounds = Mapping[str, list[float]]  # a ratio target's what -> its ratio in each round


def ratio_target(
    what: str,
    rows: Rows,
    a: tuple[str, str],
    b: tuple[str, str],
    rounds: Rounds,
    bound: float,
    stretch: float | None = None,
) -> Target:
    """A throughput ratio: the median of the run's interleaved rounds (fresh processes,
    short runs taken in turn) where it has them, the rows' single runs beside; else the
    single runs' ratio."""
    single = ratio(rows, a, b)
    measured = sorted(rounds.get(what, ()))
    if not measured:
        return Target(what, single, ">=", bound, stretch)
    beside = f"median of {len(measured)} interleaved rounds: " + ", ".join(
        f"{r:.2f}" for r in measured
    )
    if single is not None:
        beside += f"; the single runs above: {single:.2f}x"
    return Target(what, statistics.median(measured), ">=", bound, stretch, beside=beside)


def issue_23(
    rows: Rows,
    fixed: Latencies,
    at_open: Latencies,
    overload: Mapping[str, Any],
    rounds: Rounds | None = None,
    latency: LatencyRounds | None = None,
) -> list[Target | str]:
    """Hot path: throughput ratios, added latency, the Redis path and its in-flight bound."""
    rounds, latency = rounds or {}, latency or {}
    return [
        ratio_target("G1 forwarded / B2 forwarded", rows, (G1, FWD), (B2, FWD), rounds, 0.4, 0.5),
        ratio_target("G1 too-early / B3 fixed answer", rows, (G1, EARLY), B3, rounds, 0.45, 0.6),
        *added_latency(fixed, at_open, latency),
        ratio_target("G2 forwarded / G1 forwarded", rows, (G2, FWD), (G1, FWD), rounds, 0.9),
        open_p99(G2, fixed, at_open, 100.0, 50.0, latency),
        *past_the_bound(overload),
    ]


def issue_24(
    rows: Rows,
    fixed: Latencies,
    at_open: Latencies,
    rounds: Rounds | None = None,
    latency: LatencyRounds | None = None,
) -> list[Target | str]:
    """PostgreSQL store: G3 beside G1."""
    return [
        ratio_target("G3 forwarded / G1 forwarded", rows, (G3, FWD), (G1, FWD), rounds or {}, 0.8),
        open_p99(G3, fixed, at_open, 100.0, None, latency or {}),
    ]


def added_latency(
    fixed: Latencies, at_open: Latencies, latency: LatencyRounds | None = None
) -> list[Target]:
    """G1's latency over B0's at the same rate, 60% of G1's closed-loop capacity (the
    issue's table): the median over the rounds where the run has them (each round's rate
    from the capacity measured just before it, B0 at that rate in the same round), else
    the single runs'; beside it the same at 60% of G1's open-loop capacity."""
    latency = latency or {}
    g1, b0 = latency.get(G1, []), latency.get(B0, [])
    targets = []
    for name, bound, stretch in (("p50", 5.0, 2.0), ("p99", 25.0, 10.0)):
        other = _added(at_open, name)
        beside = ""
        if other is not None:
            beside = f"at 60% of open-loop capacity, {at_open[G1].rps:.0f}/s: {other:.1f} ms"
        what = f"G1 added {name} over B0, 60% of closed-loop capacity"
        if g1 and len(g1) == len(b0):
            added = [getattr(g, name) - getattr(b, name) for g, b in zip(g1, b0, strict=True)]
            shown = ", ".join(f"{a:.1f} at {g.rps:.0f}/s" for a, g in zip(added, g1, strict=True))
            rounds = f"median of {len(added)} rounds: {shown}"
            beside = f"{rounds}; {beside}" if beside else rounds
            figure: float | None = statistics.median(added)
        else:
            figure = _added(fixed, name)
        targets.append(Target(what, figure, "<=", bound, stretch, "ms", beside))
    return targets


def _added(latencies: Latencies, name: str) -> float | None:
    if G1 not in latencies or B0 not in latencies:
        return None
    return float(getattr(latencies[G1], name) - getattr(latencies[B0], name))


def open_p99(
    target: str,
    fixed: Latencies,
    at_open: Latencies,
    bound: float,
    stretch: float | None = None,
    latency: LatencyRounds | None = None,
) -> Target:
    """A store's open-loop p99 at 60% of its closed-loop capacity: the median over the
    rounds where the run has them, else the single run's; beside it, at 60% of its
    open-loop capacity where that was searched."""
    parts = []
    measured = (latency or {}).get(target, [])
    figure = fixed[target].p99 if target in fixed else None
    if measured:
        shown = ", ".join(f"{m.p99:.1f} at {m.rps:.0f}/s" for m in measured)
        parts.append(f"median of {len(measured)} rounds: {shown}")
        figure = statistics.median(m.p99 for m in measured)
    if target in at_open:
        parts.append(
            f"at 60% of open-loop capacity, {at_open[target].rps:.0f}/s: "
            f"{at_open[target].p99:.1f} ms"
        )
    short = target.split()[0]
    return Target(
        f"{short} open-loop p99, 60% of closed-loop capacity",
        figure,
        "<=",
        bound,
        stretch,
        unit="ms",
        beside="; ".join(parts),
    )


def past_the_bound(overload: Mapping[str, Any]) -> list[Target | str]:
    """G2 far past its in-flight bound: 503s answered at once, no caller queued for seconds.
    Waits run from the moment each request left the generator; beside them, the same once
    the connection was open, and how many new connections took a second or more to open
    (their SYN retried past a full listen queue: a wait in the kernel, not in the handler)."""
    if not overload:
        return ["G2 past its in-flight bound: not run (no Redis)"]
    if "skipped" in overload:
        return [f"G2 past its in-flight bound: skipped: {overload['skipped']}"]
    kinds: dict[str, dict[str, float]] = overload["kinds"]
    refused = kinds.get(OVERLOADED)
    answered = [k["max_ms"] for kind, k in kinds.items() if kind not in (OVERLOADED, "error")]
    connects = f"{overload['slow_connects']} of {overload['connections']} new connections"
    return [
        _burst(overload),
        Target(
            "G2 503 overloaded p99, past the bound",
            refused["p99_ms"] if refused else None,
            "<",
            50.0,
            unit="ms",
            beside=_refusals(refused),
        ),
        Target(
            "G2 longest wait of any caller, past the bound",
            max(k["max_ms"] for k in kinds.values()),
            "<",
            1000.0,
            unit="ms",
            beside=(f"answered ones: max {max(answered):.1f} ms" if answered else "none answered")
            + f"; {connects} took >= 1 s to open",
        ),
    ]


def _refusals(refused: Mapping[str, float] | None) -> str:
    if refused is None:
        return "no 503 overloaded answer"
    return (
        f"max {refused['max_ms']:.1f} ms; once connected p99 "
        f"{refused['connected_p99_ms']:.1f} ms, max {refused['connected_max_ms']:.1f} ms"
    )


def _burst(overload: Mapping[str, Any]) -> str:
    kinds: dict[str, dict[str, float]] = overload["kinds"]
    sent = overload["sent"]
    shares = ", ".join(f"{k['count'] / sent:.0%} {kind}" for kind, k in kinds.items())
    return (
        f"G2 past its in-flight bound (limits.max_in_flight {overload['bound']}): "
        f"{overload['rate']:.0f}/s offered for {overload['seconds']:g} s, {sent} requests:\n"
        f"    {shares}; gateway CPU {overload['busy']:.0%} of a core, generator late "
        f"{overload['late_p99_ms']:.0f} ms at p99\n"
        "    (near 100% CPU: the gateway is the bottleneck; a generator late by much: the client)"
    )


def block(sections: Mapping[str, list[Target | str]]) -> list[str]:
    """The printed block: a heading per issue, a line per target."""
    lines = []
    for heading, items in sections.items():
        lines.append(f"\n{heading}: figure  [target, stretch]  verdict")
        lines += [item.line() if isinstance(item, Target) else f"  {item}" for item in items]
    return lines

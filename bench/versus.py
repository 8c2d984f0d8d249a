"""Two checkouts' gateways side by side: ``python bench/versus.py OTHER [--rounds N]``.

OTHER is another checkout of this repository (``git worktree add /tmp/before REV``); its
``gateway`` package is imported by putting OTHER on PYTHONPATH, so run this from outside
both checkouts' folders. In each round fresh processes of B2, B3 and, for each checkout, a
SQLite gateway (forwarded polls and too-early refusals) and a PostgreSQL one when a
PostgreSQL answers (bench/run.py's rules) run SLICES short slices each, in turn; a round's
ratios are its sums' ratios. Printed: the median of each ratio with every round's figure,
and the serving processes' CPU per forwarded poll. Both checkouts are driven by this
bench's code (gateway config, demo provider), so OTHER must read the same config.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
from pathlib import Path

import run as bench

SLICES, SECONDS = 3, 2.0
Figures = dict[str, tuple[float, float | None]]  # name -> (req/s, CPU us a forwarded poll)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("other", type=Path, help="the checkout to compare this one with")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    codes = {"other": {"PYTHONPATH": str(args.other.resolve())}, "this": {}}
    postgres = bench.postgres_url()
    rounds: list[Figures] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        port = bench.free_port()
        provider = f"http://127.0.0.1:{port}"
        demo = [bench.PY, "-m", "gateway.run", "demo-provider", "--port", str(port)]
        with bench.spawn(demo, port, {"DEMO_API_KEY": bench.KEY}):
            bench.bench_policy(folder, provider)
            try:
                for number in range(args.rounds):
                    figures = _round(folder, provider, codes, postgres, number)
                    rounds.append(figures)
                    shown = ", ".join(f"{name} {rps:.0f}/s" for name, (rps, _) in figures.items())
                    print(f"round {number}: {shown}", flush=True)
            finally:
                if postgres is not None:
                    _drop(postgres, codes, args.rounds)
    _report(rounds)


def _round(
    folder: Path,
    provider: str,
    codes: dict[str, dict[str, str]],
    postgres: str | None,
    number: int,
) -> Figures:
    agent = {"Authorization": f"Bearer {bench.TOKEN}"}
    direct = {"Authorization": f"Bearer {bench.KEY}"}
    with contextlib.ExitStack() as running:
        jobs = asyncio.run(bench.submit_many(provider, direct, 100, [{"state": "running"}]))
        job_paths = [f"/v1/jobs/{j}" for j in jobs]
        targets: dict[str, tuple[str, list[str], dict[str, str]]] = {}
        bare = running.enter_context(bench._bare(folder, provider))
        assert bare is not None
        targets["B2"] = (bare, job_paths, direct)
        floor = bench.free_port()
        running.enter_context(
            bench.spawn([bench.PY, str(bench.ROOT / "bench/floor.py"), str(floor)], floor)
        )
        targets["B3"] = (f"http://127.0.0.1:{floor}", job_paths, agent)
        for code, env in codes.items():
            stores = {"G1": f"sqlite:///{folder}/{code}-{number}.db"}
            if postgres is not None:
                stores["G3"] = f"{postgres}{code}{number}"
            for kind, store in stores.items():
                serving = bench._serving(folder, store, agent, audit=True, env=env)
                gateway, paths = running.enter_context(serving)
                targets[f"{kind} {code}"] = (gateway, paths, agent)
                if kind == "G1":
                    early = [bench._too_early(gateway, agent)]
                    targets[f"too-early {code}"] = (gateway, early, agent)
        names = list(targets)
        summed, spent = dict.fromkeys(names, 0.0), dict.fromkeys(names, 0.0)
        for slice_ in range(SLICES):
            turn = (number + slice_) % len(names)
            for name in names[turn:] + names[:turn]:
                base, paths, headers = targets[name]
                pid = bench.PIDS[int(base.rsplit(":", 1)[1])]
                before = bench.cpu_seconds(pid)
                summed[name] += bench.capacity(base, paths, headers, SECONDS).rps
                spent[name] += bench.cpu_seconds(pid) - before
    forwarded = [name for name in names if name != "B3" and not name.startswith("too-early")]
    return {
        name: (
            summed[name] / SLICES,
            spent[name] / (summed[name] * SECONDS) * 1e6
            if name in forwarded and summed[name]
            else None,
        )
        for name in names
    }


def _report(rounds: list[Figures]) -> None:
    if not rounds:
        return
    print(f"\nMedian of {len(rounds)} rounds (every round's figure in brackets)")
    pairs = [
        ("G1 forwarded / B2", "G1 other", "G1 this", "B2"),
        ("G1 too-early / B3", "too-early other", "too-early this", "B3"),
        ("G3 forwarded / G1 forwarded", "G3 other", "G3 this", None),
    ]
    for what, other, this, base in pairs:
        for label, name in (("other", other), ("this", this)):
            under = base or name.replace("G3", "G1")
            if name in rounds[0] and under in rounds[0]:
                _line(f"{what}, {label}", _ratios(rounds, name, under))
    for what, name in (("G1 forwarded", "G1"), ("too-early", "too-early"), ("G3 forwarded", "G3")):
        if f"{name} this" in rounds[0]:
            _line(f"{what}, this / other", _ratios(rounds, f"{name} this", f"{name} other"))
    for name in rounds[0]:
        _line(f"{name} req/s", [r[name][0] for r in rounds], "{:.0f}")
    for name, (_, per_poll) in rounds[0].items():
        if per_poll is not None:
            _line(f"{name} CPU us a poll", [r[name][1] or 0.0 for r in rounds], "{:.0f}")


def _ratios(rounds: list[Figures], a: str, b: str) -> list[float]:
    """``a`` / ``b`` in each round where ``b`` answered at all."""
    return [r[a][0] / r[b][0] for r in rounds if r[b][0]]


def _line(what: str, figures: list[float], form: str = "{:.2f}") -> None:
    if not figures:
        print(f"  {what:<36} {'n/a':>8}")
        return
    each = ", ".join(form.format(f) for f in figures)
    print(f"  {what:<36} {form.format(statistics.median(figures)):>8}  [{each}]")


def _drop(postgres: str, codes: dict[str, dict[str, str]], rounds: int) -> None:
    import psycopg

    base, schema = postgres.split("?schema=", 1)
    with psycopg.connect(base, autocommit=True) as conn:
        for code in codes:
            for number in range(rounds):
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}{code}{number}" CASCADE')


if __name__ == "__main__":
    main()

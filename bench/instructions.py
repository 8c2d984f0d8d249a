"""`make bench-instructions`: instructions per forwarded poll, tracing off and on, and per
too-early refusal, per thread.

Throughput on a shared 2-core VM moves by 5-20% between runs of the same configuration, too
much to read a few percent off. Instructions do not: callgrind (valgrind) counts what the
gateway executes, the same for the same work whatever else the machine is doing. The gateway
runs under callgrind on a SQLite file, the demo provider and an OTLP sink natively beside it;
after a warm-up, the counters are zeroed, N forwarded polls are made one at a time, and the
counters are dumped per thread. Printed: instructions per poll on the event loop's thread,
on every other thread, and the ratio on / off. Needs valgrind (apt-get install valgrind);
takes a few minutes (the gateway runs about 50 times slower under callgrind).

Usage: instructions.py [POLLS]
"""

from __future__ import annotations

import asyncio
import http.client
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from run import (
    KEY,
    PY,
    ROOT,
    TOKEN,
    bench_policy,
    entry,
    free_port,
    gateway_config,
    spawn,
    submit_many,
)

OPERATIONS = 200
WARM_UP = 400


def _counted(
    folder: Path, env: dict[str, str], polls: int, *, early: bool = False
) -> dict[str, float]:
    """Instructions per poll by thread ("loop" is the main thread, "others" all the rest):
    forwarded polls, or (``early``) polls of one operation whose next poll is an hour away,
    each refused 429 too-early from the record."""
    port = free_port()
    config = gateway_config(folder, port, f"sqlite:///{folder}/cg-{port}.db", audit=True)
    out = folder / f"cg-{port}"
    command = ["valgrind", "--tool=callgrind", "--separate-threads=yes"]
    command += [f"--callgrind-out-file={out}.%p", PY, "-m", entry(env), "serve"]
    gateway = subprocess.Popen(
        [*command, "--config", str(config)],
        env={**os.environ, "DEMO_API_KEY": KEY, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_up(port, gateway)
        agent = {"Authorization": f"Bearer {TOKEN}"}
        base = f"http://127.0.0.1:{port}/p/bench"
        if early:
            script = [{"state": "running", "poll_after_seconds": 3600}]
            jobs = asyncio.run(submit_many(base, agent, 1, script))
        else:
            jobs = asyncio.run(submit_many(base, agent, OPERATIONS, [{"state": "running"}]))
        paths = [f"/p/bench/v1/jobs/{job}" for job in jobs]
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        expected = 429 if early else 200

        def poll(count: int) -> None:
            for n in range(count):
                connection.request("GET", paths[n % len(paths)], headers=agent)
                answer = connection.getresponse()
                answer.read()
                if answer.status != expected and not (early and n == 0 and count == WARM_UP):
                    raise RuntimeError(f"a poll was answered {answer.status}, not {expected}")

        poll(WARM_UP)
        subprocess.run(
            ["callgrind_control", "-z", str(gateway.pid)], check=True, capture_output=True
        )
        poll(polls)
        subprocess.run(
            ["callgrind_control", "-d", str(gateway.pid)], check=True, capture_output=True
        )
    finally:
        gateway.terminate()
        gateway.wait(300)
    counted = {"loop": 0.0, "others": 0.0}
    for dump in folder.glob(f"cg-{port}.{gateway.pid}.1-*"):  # part 1: the dump asked for
        total = re.search(r"^totals: (\d+)", dump.read_text(), re.M)
        thread = "loop" if dump.name.endswith("-01") else "others"
        counted[thread] += int(total.group(1)) / polls if total else 0.0
    return counted


def _wait_up(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError("the gateway exited under callgrind")
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", "/healthz")
            connection.getresponse().read()
            return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError("the gateway did not start under callgrind")


def main() -> None:
    polls = int(sys.argv[1]) if len(sys.argv) > 1 else 600
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} not found: apt-get install valgrind")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        provider_port, sink = free_port(), free_port()
        provider = f"http://127.0.0.1:{provider_port}"
        with (
            spawn(
                [PY, "-m", "gateway.run", "demo-provider", "--port", str(provider_port)],
                provider_port,
                {"DEMO_API_KEY": KEY},
            ),
            spawn([PY, str(ROOT / "bench/otlp_sink.py"), str(sink)], sink),
        ):
            bench_policy(folder, provider)
            off = _counted(folder, {}, polls)
            traced = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{sink}"}
            on = _counted(folder, traced, polls)
            early = _counted(folder, {}, polls, early=True)
    print(f"Instructions per forwarded poll (callgrind, {polls} polls one at a time, SQLite)")
    print(f"{'':<14} {'event loop':>12} {'other threads':>14} {'all':>12}")
    for name, counted in (("tracing off", off), ("tracing on", on)):
        total = counted["loop"] + counted["others"]
        print(f"{name:<14} {counted['loop']:>12,.0f} {counted['others']:>14,.0f} {total:>12,.0f}")
    refused = early["loop"] + early["others"]
    print(f"{'too-early':<14} {early['loop']:>12,.0f} {early['others']:>14,.0f} {refused:>12,.0f}")
    loop = on["loop"] / off["loop"]
    total = (on["loop"] + on["others"]) / (off["loop"] + off["others"])
    print(f"tracing on / off: event loop {loop:.3f}, all threads {total:.3f}")


if __name__ == "__main__":
    main()

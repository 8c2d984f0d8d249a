"""How long `statusgate audit verify` takes on a 100,000-line audit file.

Writes realistic lines with the gateway's own writer into a temporary folder, then times
verification of the same file with plain SHA-256 and with HMAC-SHA256, side by side.
Target (issue 3): under 5 seconds for 100,000 lines. Run: `make bench-audit`.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

from gateway.observe.audit import AuditLog, Fsync, read_lines, verify

LINES = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
TARGET_SECONDS = 5.0


def fields(i: int) -> dict[str, object]:
    return {
        "at": "2026-11-30T10:20:05.123Z",
        "operation_id": f"op_01M8N050KB050K8XHV6E{i:06d}",
        "provider": "acme-extract",
        "account": "team-a",
        "event": "polled",
        "provider_state": "running",
        "http_status": 200,
        "decision": "pending",
        "next_poll_at": "2026-11-30T10:20:14.456Z",
        "delay_source": "local_backoff",
        "requests_used": i % 12,
        "max_requests": 12,
        "deadline_at": "2026-11-30T11:00:05.000Z",
        "reason": None,
        "detail": None,
        "actor": "gateway",
    }


async def write(path: Path, key: bytes | None) -> float:
    log = AuditLog(path, key=key, fsync=Fsync.NEVER)
    log.open()
    started = time.perf_counter()
    for i in range(LINES):
        await log.append(fields(i))
    await log.close()
    return time.perf_counter() - started


def timed_verify(path: Path, key: bytes | None) -> tuple[float, int]:
    started = time.perf_counter()
    verdict = verify(read_lines(path), key)
    assert verdict.intact, verdict
    return time.perf_counter() - started, verdict.records


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        rows = []
        for name, key in (("sha256", None), ("hmac-sha256", b"bench-key")):
            path = Path(folder) / f"{name}.jsonl"
            wrote = asyncio.run(write(path, key))
            seconds, count = timed_verify(path, key)
            size = path.stat().st_size / 1e6
            rows.append((name, count, size, wrote, seconds))
    print(f"audit verify, {LINES:,} lines (target: under {TARGET_SECONDS:.0f} s)")
    heading = ("chain", "records", "MB", "write s", "verify s", "lines/s", "of target")
    print("{:<12} {:>8} {:>6} {:>8} {:>9} {:>10} {:>10}".format(*heading))
    for name, count, size, wrote, seconds in rows:
        print(
            f"{name:<12} {count:>8,} {size:>6.1f} {wrote:>8.2f} {seconds:>9.2f} "
            f"{count / seconds:>10,.0f} {seconds / TARGET_SECONDS:>9.0%}"
        )
    print(f"hmac/sha256 verify time ratio: {rows[1][4] / rows[0][4]:.2f}")


if __name__ == "__main__":
    main()

"""`python bench/pgbench_reserve.py`: the PostgreSQL reservation's ceiling, by pgbench.

A schema of this run's own gets ROWS pending operations (real records, written by the
store) with a budget that never runs out and a poll that is always due; pgbench then runs
the reservation alone, as sg_cas runs it: one UPDATE whose WHERE re-checks outcome, budget,
schedule and deadline on the database clock and rewrites the record's JSON (the version is
read and bumped in the statement, so every try writes). No gateway, no HTTP, no Python in
the loop: what the database does a second is the most any number of replicas can reserve.
Options: --clients N (8), --seconds S (15), --rows N (1000), URL (STATUSGATE_BENCH_POSTGRES,
else STATUSGATE_TEST_POSTGRES, else postgresql://postgres@127.0.0.1:5432/postgres).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SCRIPT = """\\set n random(1, {rows})
UPDATE {schema}.operations SET version = version + 1, used = used + 1,
    data = repeat('x', {size}), next_poll_at = next_poll_at
WHERE operation_id = 'op_pgb' || :n AND outcome = 'pending' AND used < budget
  AND next_poll_at <= {schema}.sg_now() + 0.05 AND deadline_at > {schema}.sg_now()
RETURNING version;
"""


async def fill(url: str, rows: int) -> int:
    """ROWS pending records through the store itself; the size of one record's JSON."""
    from gateway.core.models import DelaySource, OperationRecord
    from gateway.store import store_from_url

    store = store_from_url(url)
    await store.open()
    now = time.time()
    size = 0
    try:
        for i in range(rows):
            record = OperationRecord(
                operation_id=f"op_pgb{i + 1}",
                provider="bench",
                account="bench",
                provider_job_id=f"job_{i + 1}",
                request_fingerprint="f" * 16,
                idempotency_key=None,
                started_at=now,
                deadline_at=now + 86400,
                max_status_requests=2_000_000_000,
                max_transport_failures=3,
                max_rate_limited=3,
                next_poll_at=now - 1,
                delay_source=DelaySource.LOCAL_BACKOFF,
                credential_fingerprint="c" * 16,
                policy_fingerprint="p" * 16,
            )
            await store.create(record)
            size = len(str(record.to_dict()))
    finally:
        await store.close()
    return size


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url", nargs="?")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=int, default=15)
    parser.add_argument("--rows", type=int, default=1000)
    args = parser.parse_args()
    base = (
        args.url
        or os.environ.get("STATUSGATE_BENCH_POSTGRES")
        or os.environ.get("STATUSGATE_TEST_POSTGRES")
        or "postgresql://postgres@127.0.0.1:5432/postgres"
    ).split("?", 1)[0]
    pgbench = shutil.which("pgbench")
    if pgbench is None:
        print("pgbench is not installed (apt-get install postgresql-client)", file=sys.stderr)
        return 1
    import psycopg

    schema = f"pgbench_{os.getpid()}"
    size = asyncio.run(fill(f"{base}?schema={schema}", args.rows))
    try:
        with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as script:
            script.write(SCRIPT.format(rows=args.rows, schema=schema, size=size))
        command = [pgbench, "-n", "-M", "prepared", "-f", script.name]
        command += ["-c", str(args.clients), "-j", str(min(args.clients, os.cpu_count() or 1))]
        command += ["-T", str(args.seconds), base]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        Path(script.name).unlink()
        print(done.stdout if done.returncode == 0 else done.stderr)
        found = re.search(r"tps = ([\d.]+)", done.stdout)
        if found:
            print(
                f"reservation statement alone: {float(found.group(1)):.0f} tps "
                f"({args.clients} clients, {args.rows} operations, {size}-byte records)"
            )
        return done.returncode
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


if __name__ == "__main__":
    sys.exit(main())

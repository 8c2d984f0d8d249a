"""A full disk under the PostgreSQL store's tables forwards nothing (issue 42 item 2): the
write a submit needs before it is forwarded needs the room the record needs, so an agent is
refused (503, nothing forwarded) rather than told ``409 submission-outcome-unknown`` after
the provider created its job."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_store_postgres import admin, fill, small_filesystem

from conftest import PostgresServer, real_time_harness

pytest.importorskip("psycopg", reason="pip install -e '.[postgres]'")


async def test_a_full_tablespace_forwards_no_submit_it_cannot_record(
    private_postgres: PostgresServer, tmp_path: Path
) -> None:
    """The tablespace of a store in use fills up (one job recorded: each table has a page
    with room on it, the idempotency table's room outlasting the records'); ten submits
    (demo-jobs requires an Idempotency-Key): the provider creates exactly the jobs the
    agents were told of, the rest are refused 503 with nothing forwarded, no agent gets
    409 submission-outcome-unknown."""
    space = small_filesystem(Path(private_postgres.folder) / "space", private_postgres.user)
    with space as where:
        base = private_postgres.url
        with admin(base) as conn:
            conn.execute(f"CREATE TABLESPACE small LOCATION '{where}'")
            conn.execute("CREATE DATABASE sgfull")
            conn.execute("ALTER DATABASE sgfull SET default_tablespace = small")
        url = f"{base.rsplit('/', 1)[0]}/sgfull"
        async with real_time_harness(tmp_path, store_url=url) as harness:
            first = await harness.submit([{"state": "running"}], key="in-use")
            assert first.status in (200, 201, 202)  # a store in use: every table has a page
            fill(where)
            seen = len(list(harness.provider.log))
            answers = []
            for n in range(10):
                response = await harness.submit([{"state": "running"}], key=f"k{n}")
                answers.append((response.status, (await response.json()).get("type")))
            creates = [e for e in list(harness.provider.log)[seen:] if e["kind"] == "submit"]
            told = [a for a in answers if a[0] in (200, 201, 202)]
            assert len(creates) == len(told), (answers, creates)
            assert "/problems/submission-outcome-unknown" not in [t for _, t in answers], answers
            assert all(s == 503 for s, _ in answers if (s, _) not in told), answers
        with admin(base) as conn:
            conn.execute("DROP DATABASE sgfull WITH (FORCE)")
            conn.execute("DROP TABLESPACE small")

"""The PostgreSQL serving role needs no DDL rights (issue 42 item 3): ``statusgate migrate``,
run by the owner, creates the layout; ``serve`` only checks it, so a role with DML rights
alone serves, and a database nobody migrated is refused in one line naming the fix."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_postgres_readiness import admin
from test_store_postgres import config_for, statusgate

from conftest import real_time_harness

pytest.importorskip("psycopg", reason="pip install -e '.[postgres]'")

# docs/postgres.md's block for the serving role, run by the owner after `statusgate migrate`
GRANTS = """
GRANT USAGE ON SCHEMA public TO "{role}";
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO "{role}";
GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO "{role}";
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO "{role}";
"""


@pytest.fixture
def two_roles(postgres_base_url: str) -> Iterator[tuple[str, str, str]]:
    """A database owned by an owner role, and a serving role with no rights in it yet:
    (the owner's URL, the serving role's URL, the serving role); all dropped after."""
    tag = uuid.uuid4().hex[:10]
    owner, serving, name = f"sg_owner_{tag}", f"sg_dml_{tag}", f"sg_db_{tag}"
    base = postgres_base_url.split("?", 1)[0]
    with admin(base) as conn:
        conn.execute(f'CREATE ROLE "{owner}" LOGIN')
        conn.execute(f'CREATE ROLE "{serving}" LOGIN')
        conn.execute(f'CREATE DATABASE "{name}" OWNER "{owner}"')
        conn.execute(f'REVOKE CREATE ON DATABASE "{name}" FROM PUBLIC')
    host = base.split("@", 1)[1].rsplit("/", 1)[0]
    try:
        yield (
            f"postgresql://{owner}@{host}/{name}",
            f"postgresql://{serving}@{host}/{name}",
            serving,
        )
    finally:
        with admin(base) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'DROP ROLE IF EXISTS "{serving}"')
            conn.execute(f'DROP ROLE IF EXISTS "{owner}"')


async def test_the_owner_migrates_and_a_dml_only_role_serves(
    two_roles: tuple[str, str, str], tmp_path: Path
) -> None:
    """serve on a database nobody migrated exits 1 with one line saying to run
    ``statusgate migrate`` (no traceback, nothing created); the owner's migrate creates the
    layout; a role granted only USAGE, SELECT/INSERT/UPDATE/DELETE and EXECUTE then serves
    a submit and a poll, and is ready."""
    owner_url, serving_url, serving = two_roles
    early = statusgate("serve", "--config", str(config_for(tmp_path / "early", serving_url)))
    lines = early.stderr.strip().splitlines()
    assert early.returncode == 1, early.stderr
    assert len(lines) == 1 and "statusgate migrate" in lines[0], lines
    assert "no statusgate tables" in lines[0] and "Traceback" not in early.stderr
    with admin(owner_url) as conn:
        assert conn.execute("SELECT to_regclass('public.operations')").fetchone() == (None,)
    done = statusgate("migrate", "--config", str(config_for(tmp_path / "owner", owner_url)))
    assert done.returncode == 0 and "created at schema version 2" in done.stdout, done.stderr
    with admin(owner_url) as conn:
        conn.execute(GRANTS.format(role=serving))
    policy = {"demo-jobs": {"polling": {"base_delay": "100ms", "jitter": {"min": 1}}}}
    async with real_time_harness(
        tmp_path / "serve", store_url=serving_url, policy_changes=policy
    ) as harness:
        assert (await harness.client.get("/readyz")).status == 200
        response = await harness.submit([{"state": "running"}, {"state": "succeeded"}])
        assert response.status in (200, 201, 202), await response.text()
        job = (await response.json())["id"]
        poll = await harness.poll_when_due(job)
        assert poll.status == 200, await poll.text()
        assert len(harness.provider_calls(job)) == 1

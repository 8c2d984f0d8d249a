"""PostgreSQL readiness means writable (issue 42 item 2): ``/readyz`` is a probe write, so a
serving role whose INSERT, UPDATE and DELETE were revoked is not ready, with the reason."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.store import store_from_url

from conftest import real_time_harness

psycopg = pytest.importorskip("psycopg", reason="pip install -e '.[postgres]'")


def admin(url: str) -> psycopg.Connection:
    return psycopg.connect(url.split("?", 1)[0], autocommit=True, connect_timeout=5)


@pytest.fixture
def owned_database(postgres_base_url: str) -> Iterator[tuple[str, str]]:
    """A database and a login role of this test's own (the role owns the database, so it
    may create the store's layout there); (the role's URL, the role); both dropped after."""
    tag = uuid.uuid4().hex[:10]
    role, name = f"sg_role_{tag}", f"sg_db_{tag}"
    base = postgres_base_url.split("?", 1)[0]
    with admin(base) as conn:
        conn.execute(f'CREATE ROLE "{role}" LOGIN')
        conn.execute(f'CREATE DATABASE "{name}" OWNER "{role}"')
    host = base.split("@", 1)[1].rsplit("/", 1)[0]
    try:
        yield f"postgresql://{role}@{host}/{name}", role
    finally:
        with admin(base) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'DROP ROLE IF EXISTS "{role}"')


async def test_readyz_is_not_ready_when_the_role_cannot_write(
    owned_database: tuple[str, str], postgres_base_url: str, tmp_path: Path
) -> None:
    """With INSERT, UPDATE and DELETE revoked from the serving role, /readyz answers 503
    naming the refusal (a probe write, not ``SELECT 1``); granted again, it is ready."""
    url, role = owned_database
    migrate = store_from_url(url)
    await migrate.migrate()
    await migrate.close()
    database = url.rsplit("/", 1)[1]
    tables = "ALL TABLES IN SCHEMA public"
    async with real_time_harness(tmp_path, store_url=url) as harness:
        ready = await harness.client.get("/readyz")
        assert ready.status == 200, await ready.text()
        with admin(postgres_base_url.rsplit("/", 1)[0] + f"/{database}") as conn:
            conn.execute(f'REVOKE INSERT, UPDATE, DELETE ON {tables} FROM "{role}"')
        response = await harness.client.get("/readyz")
        body = await response.json()
        assert response.status == 503, body
        assert body["status"] == "not ready"
        assert "permission denied" in body["reason"], body
        submit = await harness.submit([{"state": "running"}], key="revoked")
        assert submit.status == 503  # what readiness foretold: every write fails
        with admin(postgres_base_url.rsplit("/", 1)[0] + f"/{database}") as conn:
            conn.execute(f'GRANT INSERT, UPDATE, DELETE ON {tables} TO "{role}"')
        assert (await harness.client.get("/readyz")).status == 200

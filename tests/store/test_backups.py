"""The backup procedures of docs/backups.md, each run once against a real store: a SQLite
file copied while a gateway serves from it, the audit chain copied and verified, a Redis
snapshot (RDB) restored into a new server, a PostgreSQL schema dumped with pg_dump and
restored into another database. After each, the copy opens as a store (or verifies) with the
operations in it."""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway import StoreError
from gateway.core.models import Outcome
from gateway.observe.audit import read_lines, verify
from gateway.store import store_from_url
from gateway.store.postgres.layout import LAYOUT as POSTGRES_LAYOUT
from gateway.store.redis.store import LAYOUT as REDIS_LAYOUT
from gateway.store.sqlite.rows import LAYOUT

from conftest import AGENT_TOKEN, RedisServer, Served, pending_record

AUTH = {"Authorization": f"Bearer {AGENT_TOKEN}"}


async def submit(served: Served, count: int) -> list[str]:
    base = f"http://127.0.0.1:{served.port}/p/demo-jobs/v1/jobs"
    ids = []
    async with aiohttp.ClientSession() as http:
        for n in range(count):
            headers = {**AUTH, "Idempotency-Key": f"b{n}-{uuid.uuid4().hex[:6]}"}
            async with http.post(base, json={}, headers=headers) as r:
                assert r.status == 202
                ids.append((await r.json())["id"])
    return ids


async def test_sqlite_online_backup_while_serving_and_the_audit_chain(
    tmp_path: Path, upstream: Any, gateways: list[Served]
) -> None:
    """sqlite3's online backup (``.backup``) of the live file while the gateway serves; the
    audit file copied as it is and verified. The copy opens as a store with every operation
    and its layout version."""
    _, url = upstream
    served = Served(tmp_path / "g", url, tmp_path / "live.db")
    await served.up()
    gateways.append(served)
    jobs = await submit(served, 20)
    copy = tmp_path / "backup.db"
    if shutil.which("sqlite3"):
        subprocess.run(["sqlite3", str(tmp_path / "live.db"), f".backup '{copy}'"], check=True)
    else:  # the same online backup API, from Python
        with sqlite3.connect(tmp_path / "live.db") as live, sqlite3.connect(copy) as target:
            live.backup(target)
    jobs += await submit(served, 5)  # the gateway went on serving meanwhile
    audit_copy = tmp_path / "audit-backup.jsonl"
    shutil.copyfile(served.folder / "audit.jsonl", audit_copy)
    served.stop()
    verdict = verify(read_lines(audit_copy), None)
    assert verdict.intact and verdict.records >= 20
    store = store_from_url(f"sqlite:///{copy}")
    await store.open()
    try:
        assert await store.migrate() == (LAYOUT, LAYOUT)
        for job in jobs[:20]:
            assert await store.find("team-a", "demo-jobs", job) is not None
    finally:
        await store.close()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        pytest.skip("redis-server and redis-cli are needed for the Redis backup procedure")
    server = RedisServer()
    server.start()
    yield server
    server.stop()


async def test_redis_snapshot_restored_into_a_new_server(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """``redis-cli --rdb`` takes a snapshot of a live Redis; a new redis-server started on
    that file serves the same operations (and the layout version key)."""
    url = f"{redis_server.url}?prefix=backup"
    store = store_from_url(url)
    await store.open()
    created = await store.create(pending_record())
    await store.close()
    folder = tmp_path / "restored"
    folder.mkdir()
    subprocess.run(
        ["redis-cli", "-p", str(redis_server.port), "--rdb", str(folder / "dump.rdb")],
        check=True,
        capture_output=True,
    )
    restored = RedisServer()
    command = ["redis-server", "--port", str(restored.port), "--bind", "127.0.0.1"]
    restored.process = subprocess.Popen(
        [*command, "--dir", str(folder), "--dbfilename", "dump.rdb", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        copy = store_from_url(f"{restored.url}?prefix=backup")
        for _ in range(50):
            try:
                assert await copy.get("op_1") == created
                break
            except StoreError:  # still loading the snapshot
                await asyncio.sleep(0.1)
        else:
            raise AssertionError("the restored Redis never served the record")
        assert await copy.migrate() == (REDIS_LAYOUT, REDIS_LAYOUT)
        await copy.close()
    finally:
        restored.stop()


async def test_postgres_dump_restored_into_another_database(
    postgres_url: str, postgres_base_url: str
) -> None:
    """``pg_dump -n SCHEMA -Fc`` of a live store and ``pg_restore`` into another database:
    the restored schema opens as a store with the operations, its layout and its functions."""
    import psycopg

    if shutil.which("pg_dump") is None or shutil.which("pg_restore") is None:
        pytest.skip("pg_dump and pg_restore are needed for the PostgreSQL backup procedure")
    store = store_from_url(postgres_url)
    await store.open()
    created = await store.create(pending_record())
    await store.close()
    base, schema = postgres_url.split("?schema=", 1)
    dump = subprocess.run(
        ["pg_dump", "--dbname", base, "--schema", schema, "--format", "custom"],
        check=True,
        capture_output=True,
    ).stdout
    target = f"sgtest_restore_{uuid.uuid4().hex[:8]}"
    admin = postgres_base_url.split("?", 1)[0]
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{target}"')
    restored_url = f"{admin.rsplit('/', 1)[0]}/{target}"
    try:
        subprocess.run(
            ["pg_restore", "--dbname", restored_url, "--no-owner"],
            input=dump,
            check=True,
            capture_output=True,
        )
        copy = store_from_url(f"{restored_url}?schema={schema}")
        await copy.open()
        try:
            assert await copy.get("op_1") == created
            assert await copy.migrate() == (POSTGRES_LAYOUT, POSTGRES_LAYOUT)
            assert await copy.acquire_lease("poll:op_1", "t", 0.0, 5.0)  # functions restored
            ended = created.evolve(outcome=Outcome.SUCCEEDED, ended_at=1.0, announce=True)
            assert await copy.save(ended)
            assert await copy.owed_completions(10) == ["op_1"]  # the outbox trigger too
        finally:
            await copy.close()
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{target}" WITH (FORCE)')

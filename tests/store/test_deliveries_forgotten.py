"""Pushes' deliveries are remembered only for their replay window: the in-process stores drop
expired ones as claims pile up, PostgreSQL's purge deletes their lease rows (Redis keys
expire by themselves)."""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.store import store_from_url
from gateway.store.base import PRUNE_AT


async def test_the_in_process_window_drops_expired_deliveries() -> None:
    """Thousands of deliveries claimed and past their window do not stay in memory: once
    PRUNE_AT leases are held the expired ones go, and a live one is still refused."""
    store = store_from_url("memory://")
    try:
        for n in range(PRUNE_AT * 3):
            assert await store.claim_delivery(f"p:old-{n}", 100.0, 1.0) is not None
        assert await store.claim_delivery("p:live", 200.0, 3600.0) is not None
        for n in range(PRUNE_AT):
            assert await store.claim_delivery(f"p:new-{n}", 200.0, 3600.0) is not None
        assert store._held is not None and len(store._held) <= PRUNE_AT * 2 + 1
        assert await store.claim_delivery("p:live", 201.0, 3600.0) is None
    finally:
        await store.close()


async def test_postgres_purge_deletes_expired_delivery_rows(postgres_url: str) -> None:
    """On PostgreSQL a delivery's lease row outlives its window until the purge, which
    deletes it (and keeps a delivery still in its window)."""
    psycopg = pytest.importorskip("psycopg", reason="pip install -e '.[postgres]'")
    store = store_from_url(postgres_url)
    await store.open()
    try:
        now = time.time()
        assert await store.claim_delivery("p:short", now, 0.05) is not None
        assert await store.claim_delivery("p:long", now, 3600.0) is not None
        await asyncio.sleep(0.3)
        await store.purge("demo-jobs", 0.0, time.time())
        schema = getattr(store, "schema", "public")
        with psycopg.connect(postgres_url.split("?", 1)[0], autocommit=True) as conn:
            names = {
                row[0]
                for row in conn.execute(
                    f'SELECT name FROM "{schema}".leases WHERE name LIKE %s', ("seen:p:%",)
                )
            }
        assert names == {"seen:p:long"}
    finally:
        await store.close()

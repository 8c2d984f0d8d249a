"""``postgresql://user[:password]@host[:port]/db?pool=N&schema=NAME&prepare=off&sslmode=...``:
durable state shared by gateway replicas (SPEC 18).

Tables (layout in ``sql/layout_N.sql``, its number in ``schema_version``): ``operations``
(the record as JSON plus the columns a query or a guard reads), ``idempotency``,
``leases``, ``pacing``; every replica's audit lines in ``audit_lines`` (``audit.py``).
Every multi-step write is one statement or one function call, so one round trip and
atomic: the reservation is ``sg_cas``'s UPDATE, whose WHERE re-checks outcome, budget,
next_poll_at and deadline on the database clock (READ COMMITTED re-checks it on the newest
row version, so concurrent replicas cannot overspend); a poll's first
step (lease, pacing window, reservation) is ``sg_start``; its write-back is ``sg_finish``,
fenced: written only while the poll's token still holds the lease, the lease row locked
until commit. The gateway's clock is the database clock (an offset refreshed in the
background), the one all replicas share.

The hot statements (a poll's ``sg_start`` and ``sg_finish``, ``sg_cas``, ``get``, the
turn's finds) go through turns.Turns: one pipeline per turn of the event loop on
connections of their own, the callers of a pipeline grouped into two implicit transactions
(those that need no WAL flush, then the rest; a failed group sent again one caller a
transaction). The rest
(create, idempotency, leases, lists, purge, the locked fallbacks, the clock) take a pooled
connection.

Never here: session advisory locks (poolers hand sessions around), NOTIFY (a global lock at
commit), hot counters in indexes. Driver errors (refused, dropped, timeouts, an exhausted
pool) become StoreError in ``_failed`` and nowhere else; every call is bounded by
``timeout`` (1 s), so the gateway fails closed quickly and reconnects by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any, ClassVar

import orjson
import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from gateway import StoreError
from gateway.core.models import IdempotencyEntry, OperationFilter, OperationRecord, Outcome
from gateway.core.pacing import GUARD, MIN_WAIT
from gateway.store.base import (
    PURGE_BATCH,
    Ids,
    LeaseLost,
    Mutation,
    Queue,
    Store,
    T,
    newer_layout,
    stop,
)
from gateway.store.postgres.audit import AuditRows
from gateway.store.postgres.keys import PostgresKeys
from gateway.store.postgres.layout import LAYOUT, migrate_layout
from gateway.store.postgres.outbox import PostgresOutbox
from gateway.store.postgres.probe import create_query, reserve_query, write_probe
from gateway.store.postgres.rows import (
    CASArgs,
    cas_args,
    idem_row,
    load,
    written,
)
from gateway.store.postgres.statements import Statements, describe, found_layout, holds
from gateway.store.postgres.turns import LINKS, Call, Rows, Turns
from gateway.store.shared import Batch, Copies, Job, SharedClock

RECONNECT = 2.0  # seconds a pool's connection attempt keeps retrying before a fresh one


class PostgresStore(PostgresKeys, PostgresOutbox, Store):
    shared: ClassVar[bool] = True

    def __init__(
        self,
        conninfo: str,
        *,
        schema: str = "public",
        pool: int = 10,
        pipelines: int = LINKS,
        prepare: bool = True,
        timeout: float = 1.0,
    ) -> None:
        self.schema = schema
        self._conninfo = conninfo
        self._timeout = timeout
        self._s = sql.Identifier(schema).as_string(None)
        self._pool = AsyncConnectionPool(
            conninfo,
            min_size=pool,  # all opened at start: a burst never waits for connects
            max_size=pool,
            timeout=timeout,
            open=False,
            kwargs={"autocommit": True, "prepare_threshold": 5 if prepare else None},
            # A connection attempt retries with backoff (1 s, then doubling) until this
            # many seconds, then gives up; the next call starts a fresh one at once. Short,
            # so the pool is back within about a second of the database, however long the
            # outage was.
            reconnect_timeout=RECONNECT,
            name=f"statusgate-{schema}",
            configure=self._configure if prepare else None,
        )
        self._opened = False
        self._copies = Copies()  # pending records as last written or read here (``known``)
        self._finds: Batch[Job, OperationRecord] = Batch(self._find_many)
        self._clock = SharedClock(self._database_time)
        self.audit_lines = AuditRows(self._connection, self._s, self.clock)
        self._checking: asyncio.Task[None] | None = None
        self._prepare = prepare
        q = self._q = Statements.of(self._s)
        hot = (q.start, q.finish, q.cas, q.index)
        self._turns = Turns(
            self._turn_connection,
            (*hot, q.get, q.find, q.finds),
            prepare=prepare,
            timeout=timeout,
            links=pipelines,
        )

    # -- plumbing -----------------------------------------------------------------------
    async def _configure(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Each new connection's session, so the server gives up when the gateway has: a
        statement ends at ``timeout`` (the client stopped waiting then), and a backend whose
        client died (a SIGKILLed gateway) notices within a quarter second instead of running
        its queued write whenever a lock lets it. Not behind PgBouncer (``prepare=off``),
        where a session setting would leak to other clients."""
        settings = {
            "statement_timeout": f"{max(1, int(self._timeout * 1000))}ms",
            "client_connection_check_interval": "250ms",  # PostgreSQL 14 and later
        }
        for name, value in settings.items():
            with contextlib.suppress(psycopg.Error):
                await conn.execute("SELECT set_config(%s, %s, false)", (name, value))

    async def _turn_connection(self) -> psycopg.AsyncConnection[Any]:
        """A connection of the turns' own (``Turns`` puts it in pipeline mode)."""
        conn = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
        if self._prepare:
            await self._configure(conn)
        return conn

    def _failed(self, operation: str, exc: BaseException) -> StoreError:
        """The one place driver errors become StoreError."""
        self._check_soon()
        if isinstance(exc, PoolTimeout):
            said = f"no connection within {self._timeout:g}s"
        else:
            said = describe(exc)
        return StoreError(f"postgresql {operation}: {said}", operation=operation)

    @contextlib.asynccontextmanager
    async def _connection(self, operation: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A pooled connection for one call, within ``timeout``."""
        if not self._opened:
            raise StoreError(f"postgresql {operation}: the store is not open", operation=operation)
        try:
            async with asyncio.timeout(self._timeout), self._pool.connection() as conn:
                yield conn
        except (psycopg.Error, OSError, TimeoutError) as exc:
            raise self._failed(operation, exc) from exc

    async def _turn(self, operation: str, *calls: Call, flush: bool = True) -> list[Rows]:
        """The rows of each of ``calls``, sent in this turn's pipeline (one transaction
        for them all), within ``timeout``; ``flush=False`` when the commit need not wait
        for the WAL flush (a read, or a write a database crash may cost)."""
        if not self._opened:
            raise StoreError(f"postgresql {operation}: the store is not open", operation=operation)
        try:
            return await self._turns.call(*calls, flush=flush)
        except (psycopg.Error, OSError, TimeoutError) as exc:
            raise self._failed(operation, exc) from exc

    def _check_soon(self) -> None:
        """After a failure, have the pool test its idle connections in the background, so
        connections a database restart broke are replaced before the next calls meet them."""
        if self._checking is None or self._checking.done():
            self._checking = asyncio.get_running_loop().create_task(self._check_pool())

    async def _check_pool(self) -> None:
        with contextlib.suppress(Exception):
            await self._pool.check()

    async def _one(self, operation: str, query: str, args: CASArgs = ()) -> Any:
        """The first row of ``query``, or None."""
        async with self._connection(operation) as conn:
            cursor = await conn.execute(query.encode(), args)
            return await cursor.fetchone()

    async def _all(self, operation: str, query: str, args: CASArgs = ()) -> list[Any]:
        async with self._connection(operation) as conn:
            cursor = await conn.execute(query.encode(), args)
            return await cursor.fetchall()

    # -- life ---------------------------------------------------------------------------
    async def open(self) -> None:
        """Check the layout is the one this code writes, then open the pool. Serving needs
        no DDL rights: ``statusgate migrate``, run by a role that owns the schema, creates
        and upgrades the layout; a missing, older or newer one is refused by name. A
        database that cannot be reached, or refuses these credentials, is one clear line."""
        found = await self.layout()
        if found is not None and found > LAYOUT:
            raise newer_layout("postgresql", found, LAYOUT)
        if found != LAYOUT:
            held = "no statusgate tables" if found is None else f"schema version {found}"
            raise StoreError(
                f"the postgresql store (schema {self.schema}) holds {held}; this statusgate"
                f" serves schema version {LAYOUT}: run `statusgate migrate` (as a role that"
                " may create tables in the schema) first",
                operation="open",
            )
        await self._pool.open(wait=False)
        await self._turns.open()
        self._opened = True
        await self._clock.start()

    async def close(self) -> None:
        await self._clock.close()
        await stop(self._checking)
        if self._opened:
            self._opened = False
            await self._turns.aclose()
            await self._pool.close()

    async def ping(self) -> None:
        """Ready means writable: probe.write_probe writes, changes and deletes a row about a
        record's size in the tables a submit writes, in a transaction rolled back."""
        async with self._connection("ping") as conn:
            await write_probe(conn, self._s)

    async def _direct(self) -> psycopg.AsyncConnection[Any]:
        """One connection outside the pool (layout work): its failure said plainly."""
        try:
            async with asyncio.timeout(max(self._timeout, 5.0)):
                return await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
        except (psycopg.Error, OSError, TimeoutError) as exc:
            raise StoreError(f"postgresql: {describe(exc)}", operation="open") from exc

    async def layout(self) -> int | None:
        """The layout version the database holds: None when there is none yet."""
        conn = await self._direct()
        try:
            return await found_layout(conn, self.schema)
        except psycopg.Error as exc:
            raise StoreError(f"postgresql: {describe(exc)}", operation="open") from exc
        finally:
            await conn.close()

    async def inspect(self) -> str:
        """Connect once (credentials, database, reachability) and read the layout."""
        found = await self.layout()
        if found is not None and found > LAYOUT:
            raise newer_layout("postgresql", found, LAYOUT)
        if found is None:
            return " (reachable; no tables yet: statusgate migrate creates them)"
        if found < LAYOUT:
            return f" (schema version {found}; statusgate migrate upgrades it to {LAYOUT})"
        return f" (schema version {found})"

    async def migrate(self) -> tuple[int | None, int]:
        """Create or upgrade the layout (layout.migrate_layout): (found, now)."""
        conn = await self._direct()
        try:
            return await migrate_layout(conn, self.schema), LAYOUT
        except psycopg.Error as exc:
            raise StoreError(f"postgresql: {describe(exc)}", operation="open") from exc
        finally:
            await conn.close()

    # -- clock --------------------------------------------------------------------------
    def clock(self) -> float:
        """Database time as seen from here (shared.SharedClock)."""
        return self._clock.now()

    async def _database_time(self) -> float:
        row = await self._one("time", f"SELECT {self._s}.sg_now()")
        return float(row[0])

    # -- operations ---------------------------------------------------------------------
    async def create(
        self, record: OperationRecord, idempotency: IdempotencyEntry | None = None
    ) -> OperationRecord:
        """The row ``claim_submission`` reserved becomes the record (an UPDATE on the page
        the reservation found room on); without one, the record is inserted."""
        query, args = create_query(self._s, record, idempotency)
        row = await self._one("create", query, args)
        if row[0]:
            self._copies.keep(record)
            await self._index(record)
            return record
        existing = await self.find(record.account, record.provider, record.provider_job_id)
        if existing is None:  # purged between the two statements: the job is free again
            return await self.create(record, idempotency)
        with contextlib.suppress(StoreError):  # else purged once its retention is over
            await self.release_submission(record.operation_id)
        return existing

    async def get(self, operation_id: str) -> OperationRecord | None:
        [rows] = await self._turn("get", (self._q.get, (operation_id,)), flush=False)
        return self._seen(load(rows[0]) if rows else None)

    def _seen(self, record: OperationRecord | None) -> OperationRecord | None:
        if record is not None:
            self._copies.keep(record)
        return record

    def known(self, account: str, provider: str, job_id: str) -> OperationRecord | None:
        """The record as this process last wrote or read it, without a round trip."""
        return self._copies.known(account, provider, job_id)

    async def find(self, account: str, provider: str, job_id: str) -> OperationRecord | None:
        """Finds asked in one turn of the event loop share one query (many agents polling
        at once, the gateway's reason to exist, cost a round trip a turn, not a call)."""
        return self._seen(await self._finds.ask((account, provider, job_id)))

    async def _find_many(self, jobs: list[Job]) -> dict[Job, OperationRecord]:
        if len(jobs) == 1:
            [rows] = await self._turn("find", (self._q.find, jobs[0]), flush=False)
        else:
            columns = tuple(list(column) for column in zip(*jobs, strict=True))
            [rows] = await self._turn("find", (self._q.finds, columns), flush=False)
        records = [record for row in rows if (record := load(row)) is not None]
        return {(r.account, r.provider, r.provider_job_id): r for r in records}

    async def save(self, record: OperationRecord) -> bool:
        # the index in the write's own transaction: a write that returned is always findable
        answers = await self._turn("save", *self._indexed(record), (self._q.cas, cas_args(record)))
        return self._wrote(record, _integer(answers[-1]))

    def _indexed(self, record: OperationRecord) -> list[Call]:
        """The statement that indexes ``record``'s result values (none without values),
        for the turn that writes it."""
        values = record.result_values
        if not values:
            return []
        args = (record.account, record.provider, record.operation_id, list(values))
        return [(self._q.index, args)]

    async def _index(
        self, record: OperationRecord, conn: psycopg.AsyncConnection[Any] | None = None
    ) -> None:
        """SPEC 20: the record's result values, written before the record's own write (or
        in its transaction), so a write that returned is always findable; a row whose write
        then lost is ignored by ``find_result``, which checks the record lists the value.
        The operation's row exists already (the foreign key), except at ``create``, which
        indexes after its insert."""
        values = record.result_values
        if not values:
            return
        query = self._q.index_sql.encode()
        args = (record.account, record.provider, record.operation_id, list(values))
        if conn is not None:
            await conn.execute(query, args)
            return
        async with self._connection("save") as fresh:
            await fresh.execute(query, args)

    async def find_result(self, account: str, provider: str, value: str) -> OperationRecord | None:
        """From the result_values table; the record itself is checked to still list it."""
        s = self._s
        rows = await self._all(
            "find_result",
            f"SELECT o.data FROM {s}.result_values v JOIN {s}.operations o USING (operation_id)"
            " WHERE v.account = %s AND v.provider = %s AND v.value = %s LIMIT 1",
            (account, provider, value),
        )
        record = load(rows[0]) if rows else None
        return record if record is not None and value in record.result_values else None

    def _wrote(self, record: OperationRecord, answer: int) -> bool:
        """sg_cas's answer for writing ``record``: kept as the copy when written."""
        if written(answer):
            self._copies.keep(record.evolve(version=record.version + 1))
            return True
        return False

    async def mutate(
        self, operation_id: str, change: Mutation[T], *, known: OperationRecord | None = None
    ) -> T:
        """``known`` tried first (one round trip); else in one transaction with the row
        locked, so no other writer can come between the read and the write."""
        if known is not None:
            new, result = change(known)
            if new is not None and await self.save(new):
                return result
        return await self._locked("mutate", operation_id, change)

    async def _locked(
        self, operation: str, operation_id: str, change: Mutation[T], fence: Fence = None
    ) -> T:
        s = self._s
        async with self._connection(operation) as conn, conn.transaction():
            held = fence is None or await holds(conn, s, *fence)
            lock = " FOR UPDATE" if held else ""
            cursor = await conn.execute(
                f"SELECT data FROM {s}.operations WHERE operation_id = %s{lock}".encode(),
                (operation_id,),
            )
            current = load(await cursor.fetchone())
            if current is None:
                raise StoreError(f"{operation_id} vanished from the store", operation=operation)
            new, result = change(current)
            if not held:  # fenced out: an answer that writes nothing may still be given
                if new is None:
                    return result
                raise LeaseLost(f"postgresql {operation}: the poll lease was lost; not written")
            if new is not None:
                cursor = await conn.execute(self._q.cas_sql.encode(), cas_args(new))
                row = await cursor.fetchone()
                if row is None or not self._wrote(new, row[0]):  # locked: only the clock refuses
                    raise StoreError(f"{operation_id}: version moved", operation=operation)
                await self._index(new, conn)
            if fence is not None:
                await conn.execute(
                    f"UPDATE {s}.leases SET token = '', expires_at = 0"
                    " WHERE name = %s AND token = %s".encode(),
                    fence,
                )
            return result

    async def list(self, where: OperationFilter) -> list[OperationRecord]:
        clauses: list[str] = ["outcome <> 'reserved'"]  # a submission's reservation
        args: list[Any] = []
        for column, value in (
            ("outcome", where.outcome),
            ("provider", where.provider),
            ("account", where.account),
        ):
            if value is not None:
                clauses.append(f"{column} = %s")
                args.append(str(value.value if isinstance(value, Outcome) else value))
        if where.before is not None:  # a page's position: strictly older in list order
            clauses.append("(started_at, operation_id) < (%s, %s)")
            args += list(where.before)
        query = f"SELECT data FROM {self._s}.operations WHERE " + " AND ".join(clauses)
        query += " ORDER BY started_at DESC, operation_id DESC LIMIT %s"
        rows = await self._all("list", query, (*args, where.limit))
        return [OperationRecord.from_dict(orjson.loads(row[0])) for row in rows]

    async def purge(self, provider: str, ended_before: float, now: float) -> int:
        """One statement: rows another replica is deleting are skipped, so each goes once."""
        s = self._s
        query = (
            f"WITH gone AS (DELETE FROM {s}.operations WHERE operation_id IN"
            f" (SELECT operation_id FROM {s}.operations WHERE provider = %s"
            " AND outcome <> 'pending' AND ended_at < %s AND NOT EXISTS (SELECT 1 FROM"
            f" {s}.completions c WHERE c.operation_id = {s}.operations.operation_id"
            " AND NOT c.sent) LIMIT %s FOR UPDATE SKIP LOCKED)"
            " RETURNING operation_id),"
            f" leases AS (DELETE FROM {s}.leases WHERE name IN"
            " (SELECT 'poll:' || operation_id FROM gone"
            " UNION ALL SELECT 'completion:' || operation_id FROM gone)),"
            # pushes' deliveries past their replay window (claim_delivery's leases)
            f" seen AS (DELETE FROM {s}.leases WHERE name IN (SELECT name FROM {s}.leases"
            f" WHERE name LIKE 'seen:%%' AND expires_at < {s}.sg_now() LIMIT %s"
            " FOR UPDATE SKIP LOCKED)),"
            f" idem AS (DELETE FROM {s}.idempotency WHERE key IN (SELECT key FROM"
            f" {s}.idempotency WHERE expires_at <= %s LIMIT %s FOR UPDATE SKIP LOCKED))"
            " SELECT count(*) FROM gone"
        )
        args = (provider, ended_before, PURGE_BATCH, 10_000, now, 10_000)
        row = await self._one("purge", query, args)
        return int(row[0])

    async def overdue(self, provider: str, now: float, limit: int) -> Ids:
        rows = await self._all(
            "overdue",
            f"SELECT operation_id FROM {self._s}.operations WHERE provider = %s"
            " AND outcome = 'pending' AND deadline_at <= %s ORDER BY deadline_at LIMIT %s",
            (provider, now, limit),
        )
        return [str(row[0]) for row in rows]

    async def open_escalations(self) -> dict[tuple[str, str], int]:
        rows = await self._all(
            "open_escalations",
            f"SELECT provider, reason, count(*) FROM {self._s}.operations"
            " WHERE outcome = 'escalated' AND reason IS NOT NULL GROUP BY 1, 2",
        )
        return {(str(p), str(r)): int(n) for p, r, n in rows}

    async def escalation_queue(self, limit: int) -> Queue:
        """The oldest open escalations, ordered in the database (only ``limit`` records
        leave it), and the count of them all; both read the escalated rows' partial index."""
        s = self._s
        at = "((data::jsonb) -> 'escalation' ->> 'at')::double precision"
        rows = await self._all(
            "escalation_queue",
            f"SELECT data FROM {s}.operations WHERE outcome = 'escalated'"
            f" ORDER BY {at}, operation_id LIMIT %s",
            (limit,),
        )
        counted = await self._all(
            "escalation_queue",
            f"SELECT count(*) FROM {s}.operations WHERE outcome = 'escalated'",
        )
        waiting = [OperationRecord.from_dict(orjson.loads(row[0])) for row in rows]
        return waiting, int(counted[0][0])

    async def active_counts(self) -> dict[str, int]:
        rows = await self._all(
            "active_counts",
            f"SELECT provider, count(*) FROM {self._s}.operations"
            " WHERE outcome = 'pending' GROUP BY provider",
        )
        return {str(p): int(n) for p, n in rows}

    # -- idempotency --------------------------------------------------------------------
    async def claim_idempotency(
        self, entry: IdempotencyEntry, now: float
    ) -> IdempotencyEntry | None:
        row = await self._one(
            "claim_idempotency",
            f"SELECT {self._s}.sg_claim(%s, %s, %s, %s)",
            (*idem_row(entry), now),
        )
        return None if row[0] is None else IdempotencyEntry.from_dict(orjson.loads(row[0]))

    async def claim_submission(
        self,
        entry: IdempotencyEntry | None,
        now: float,
        operation_id: str,
        account: str,
        provider: str,
    ) -> IdempotencyEntry | None:
        """The claim and the record's row reserved in one statement, so the write that must
        succeed before a submission is forwarded needs the room its record needs: a full
        disk refuses it with nothing forwarded, never after the provider made the job. The
        reserved row (outcome ``reserved``, data about a record's size) is no record: no
        query reads it but ``create``, which turns it into the record, and ``purge``, which
        removes one left behind (a gateway stopped mid-submit) after the retention."""
        query, args = reserve_query(self._s, entry, now, operation_id, account, provider)
        row = await self._one("claim_idempotency", query, args)
        return None if row[0] is None else IdempotencyEntry.from_dict(orjson.loads(row[0]))

    async def release_submission(self, operation_id: str) -> None:
        await self._one(
            "drop_idempotency",
            f"DELETE FROM {self._s}.operations WHERE operation_id = %s"
            " AND outcome = 'reserved' RETURNING 1",
            (operation_id,),
        )

    async def put_idempotency(self, entry: IdempotencyEntry) -> None:
        await self._one(
            "put_idempotency",
            f"INSERT INTO {self._s}.idempotency (key, expires_at, data) VALUES (%s, %s, %s)"
            " ON CONFLICT (key) DO UPDATE SET expires_at = excluded.expires_at,"
            " data = excluded.data RETURNING 1",
            idem_row(entry),
        )

    async def drop_idempotency(self, key: str) -> None:
        await self._one(
            "drop_idempotency",
            f"DELETE FROM {self._s}.idempotency WHERE key = %s RETURNING 1",
            (key,),
        )

    # -- leases -------------------------------------------------------------------------
    async def acquire_lease(self, name: str, token: str, now: float, ttl: float) -> bool:
        """Expiry runs on the database clock; ``now`` is not needed here."""
        row = await self._one(
            "acquire_lease", f"SELECT {self._s}.sg_acquire(%s, %s, %s)", (name, token, ttl)
        )
        return bool(row[0])

    async def release_lease(self, name: str, token: str) -> None:
        await self._one(
            "release_lease",
            f"UPDATE {self._s}.leases SET token = '', expires_at = 0"
            " WHERE name = %s AND token = %s RETURNING 1",
            (name, token),
        )

    async def start_poll(
        self, lease: str, token: str, now: float, ttl: float, provider: str, rate: float | None
    ) -> float | None:
        """Lease and pacing window in one call (database time throughout)."""
        wait, _, _ = await self._start(lease, token, ttl, provider, rate, None)
        return wait

    async def start_and_reserve(
        self,
        lease: str,
        token: str,
        now: float,
        ttl: float,
        provider: str,
        rate: float | None,
        reserve: OperationRecord,
    ) -> tuple[float | None, bool, OperationRecord | None]:
        """Lease, pacing window and the reservation in one call, which hands back the stored
        record when ``reserve`` was computed from an older one."""
        return await self._start(lease, token, ttl, provider, rate, reserve)

    async def _start(
        self,
        lease: str,
        token: str,
        ttl: float,
        provider: str,
        rate: float | None,
        reserve: OperationRecord | None,
    ) -> tuple[float | None, bool, OperationRecord | None]:
        cas = cas_args(reserve) if reserve is not None else (None,) * 11
        args = (lease, token, ttl, provider, rate or 0.0, GUARD, MIN_WAIT, *cas)
        [rows] = await self._turn("acquire_lease", (self._q.start, args))
        wait, written, moved = float(rows[0][0] or 0), int(rows[0][1] or 0), rows[0][2]
        if wait < 0:
            return None, False, None
        if reserve is not None and written != 0:
            self._wrote(reserve, written)  # raises NotAdmissible when refused by the clock
        stored = None if moved is None else OperationRecord.from_dict(orjson.loads(moved))
        if stored is not None:
            self._copies.keep(stored)
        elif reserve is not None and written == -1:
            self._copies.forget(reserve.operation_id)  # gone
        return float(wait), written == 1, stored

    async def finish_poll(
        self,
        operation_id: str,
        change: Mutation[T],
        *,
        known: OperationRecord,
        lease: str,
        token: str,
        durable: Callable[[T], bool] | None = None,
    ) -> T:
        """Fenced: the write computed from ``known`` and the release in one call while the
        token holds the lease; when ``known`` was not current, one transaction with the
        lease and the row locked. A lost lease (expired, or taken by another poll) writes
        nothing: ``change`` is applied to the stored record and its result returned when it
        writes nothing (a poll superseded by a later one), else LeaseLost is raised.

        A result ``durable`` calls not durable yet (a pending answer) commits without
        waiting for the WAL flush (``synchronous_commit`` off for the transaction of the
        pipeline's unflushed callers, which holds no write that must be flushed):
        its reservation was flushed, so a database crash can cost the answer (the gateway
        then audits the call as interrupted), never a budget; the next flushed commit
        flushes it too."""
        new, result = change(known)
        if new is not None:
            # the index in the write's transaction (a lost write leaves rows find_result ignores)
            answers = await self._turn(
                "save",
                *self._indexed(new),
                (self._q.finish, (lease, token, *cas_args(new))),
                flush=durable is None or durable(result),
            )
            answer = _integer(answers[-1])
            if answer != -3 and self._wrote(new, answer):
                return result
        return await self._locked("save", operation_id, change, (lease, token))

    # -- pacing -------------------------------------------------------------------------
    async def pace(self, provider: str, rate: float | None, now: float) -> float:
        row = await self._one(
            "pace",
            f"SELECT {self._s}.sg_pace(%s, %s, %s, %s)",
            (provider, rate or 0.0, GUARD, MIN_WAIT),
        )
        return max(0.0, float(row[0]))

    async def bound_pause(self, provider: str, latest: float) -> None:
        await self._one(
            "tighten",
            f"UPDATE {self._s}.pacing SET tight_until = %s"
            " WHERE provider = %s AND tight_until > %s RETURNING 1",
            (latest, provider, latest),
        )

    async def tighten(self, provider: str, rate: float, until: float) -> None:
        """Kept unless a tightening as strict or stricter lasts longer already."""
        s = self._s
        await self._one(
            "tighten",
            f"INSERT INTO {s}.pacing AS p (provider, tight_rate, tight_until) VALUES (%s, %s, %s)"
            " ON CONFLICT (provider) DO UPDATE SET tight_rate = excluded.tight_rate,"
            " tight_until = excluded.tight_until WHERE p.tight_until IS NULL"
            " OR p.tight_until <= excluded.tight_until OR p.tight_rate > excluded.tight_rate"
            " RETURNING 1",
            (provider, rate, until),
        )


Fence = tuple[str, str] | None  # (lease name, token) a write must still hold


def _integer(rows: Rows) -> int:
    """A function's integer answer: the first column of the one row."""
    return int(rows[0][0] or 0)

"""Audit across replicas (SPEC 25): on PostgreSQL every replica's audit lines are also kept
in the database, one chain per replica, and an operation's story is told from all of them;
elsewhere ``audit story --from FILE...`` merges the replicas' files.

Two real gateway processes share one PostgreSQL and serve one job's polls; the story, the
chains and a tampered line are read through the CLI and the admin API, as an operator would.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import test_postgres_roles as roles
from aiohttp.test_utils import TestServer

from gateway.demo.provider import DemoProvider
from gateway.observe.audit import AuditLog
from gateway.observe.mirror import AuditMirror, offset_after

from conftest import (
    AGENT_TOKEN,
    OPERATOR_TOKEN,
    PROVIDER_ENV,
    PROVIDER_KEY,
    drop_schema,
    free_port,
    real_time_harness,
    run_statusgate,
    start_statusgate,
    stop_statusgates,
    wait_until_up,
    write_config,
)

AUTH = {"Authorization": f"Bearer {AGENT_TOKEN}"}
two_roles = roles.two_roles  # the fixture: an owner role's database and a serving role
ADMIN = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
REPLICAS = ("replica-a", "replica-b")


def statusgate(*args: str) -> subprocess.CompletedProcess[str]:
    return run_statusgate(*args, timeout=120)


def connect(url: str) -> Any:
    import psycopg

    return psycopg.connect(url.split("?", 1)[0], autocommit=True, connect_timeout=5)


@dataclass
class Pair:
    urls: list[str]
    configs: list[Path]
    audits: list[Path]
    store_url: str

    @property
    def schema(self) -> str:
        return self.store_url.rsplit("schema=", 1)[1].split("&", 1)[0]

    def lines(self, index: int, operation_id: str) -> list[dict[str, Any]]:
        found = [json.loads(raw) for raw in self.audits[index].read_text().splitlines()]
        return [line for line in found if line.get("operation_id") == operation_id]


@pytest.fixture
async def pair(postgres_url: str, tmp_path: Path) -> AsyncIterator[Pair]:
    """Two gateway processes on one PostgreSQL, named replica-a and replica-b, each with
    its own audit file, in front of one demo provider."""
    demo = DemoProvider(api_key=PROVIDER_KEY)
    provider = TestServer(demo.app(), host="127.0.0.1")
    await provider.start_server()
    upstream = str(provider.make_url("")).rstrip("/")
    polling = {"base_delay": "200ms", "max_delay": "200ms", "jitter": {"min": 1.0, "max": 1.0}}
    polling |= {"max_status_requests": 50, "deadline": "10m"}
    processes, urls, configs, audits = [], [], [], []
    for name in REPLICAS:
        port = free_port()
        folder = tmp_path / name
        config = write_config(
            folder,
            upstream,
            store=postgres_url,
            policy_changes={"demo-jobs": {"polling": polling}},
            config_changes={"listen": {"port": port}, "audit": {"replica": name}},
        )
        env = {**os.environ, **PROVIDER_ENV}
        processes.append(start_statusgate(["serve", "--config", str(config)], env))
        urls.append(f"http://127.0.0.1:{port}")
        configs.append(config)
        audits.append(folder / "audit.jsonl")
    try:
        for url, process in zip(urls, processes, strict=True):
            await asyncio.to_thread(wait_until_up, int(url.rsplit(":", 1)[1]), process)
        yield Pair(urls, configs, audits, postgres_url)
    finally:
        stop_statusgates(processes, 20)
        await provider.close()


async def polled_on_both(http: aiohttp.ClientSession, pair: Pair) -> str:
    """A job submitted on replica-a, polled on both until each has sent the provider a call."""
    async with http.post(
        f"{pair.urls[0]}/p/demo-jobs/v1/jobs",
        json={"demo_script": [{"state": "running"}]},
        headers={**AUTH, "Idempotency-Key": "one-job"},
    ) as response:
        assert response.status == 202, await response.text()
        job = str((await response.json())["id"])
    operation_id = ""
    deadline = time.monotonic() + 60
    for index in (0, 1):  # replica-a's poll, then replica-b's
        while time.monotonic() < deadline:
            url = pair.urls[index]
            async with http.get(f"{url}/p/demo-jobs/v1/jobs/{job}", headers=AUTH) as response:
                assert response.status in (200, 429), await response.text()
                operation_id = response.headers.get("Statusgate-Operation", operation_id)
            if any(line["event"] == "polled" for line in pair.lines(index, operation_id)):
                break
            await asyncio.sleep(0.05)
    if operation_id and all(pair.lines(i, operation_id) for i in (0, 1)):
        return operation_id
    raise AssertionError("both replicas never polled the job")


async def settled_story(http: aiohttp.ClientSession, pair: Pair, operation_id: str) -> Any:
    """The admin API's view of the operation once it holds every line of both files (the
    lines reach the database a moment after the files) and no more are being written."""
    last: Any = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        async with http.get(f"{pair.urls[0]}/admin/operations/{operation_id}", headers=ADMIN) as r:
            assert r.status == 200, await r.text()
            shown = await r.json()
        written = len(pair.lines(0, operation_id)) + len(pair.lines(1, operation_id))
        if len(shown["story"]) == written and last is not None and last == shown["story"]:
            return shown
        last = shown["story"] if len(shown["story"]) == written else None
        await asyncio.sleep(1.5)
    raise AssertionError(f"the story never settled on every line: {last}")


async def test_two_replicas_tell_one_story_and_verify_their_chains(pair: Pair) -> None:
    """One job polled on two replicas: the admin API on either and ``audit story`` show every
    line of both files, in time order, each naming its replica; ``audit verify --config``
    finds both database chains intact; a line altered in the database breaks its chain at
    that seq (exit 1), the other chain still intact; no secret is in any kept line."""
    async with aiohttp.ClientSession() as http:
        operation_id = await polled_on_both(http, pair)
        shown = await settled_story(http, pair, operation_id)
        async with http.get(f"{pair.urls[1]}/admin/operations/{operation_id}", headers=ADMIN) as r:
            assert (await r.json())["story"] == shown["story"]  # the same from either replica
    story, kept = shown["story"], shown["story_lines"]
    assert shown["story_note"] is None
    assert {line["replica"] for line in kept} == set(REPLICAS)
    assert [line["at"] for line in kept] == sorted(line["at"] for line in kept)
    for line, entry in zip(story, kept, strict=True):
        assert line.endswith(f" (replica {entry['replica']})"), line
    assert story[0].split(" ", 1)[1].startswith("submitted") and "replica-a" in story[0]
    assert any("polled" in line and "(replica replica-b)" in line for line in story)

    told = statusgate("audit", "story", "--config", str(pair.configs[1]), operation_id)
    assert told.returncode == 0, told.stderr
    assert told.stdout.splitlines() == story

    checked = statusgate("audit", "verify", "--config", str(pair.configs[0]))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    for name in REPLICAS:
        assert any(
            line.startswith(f"postgresql audit chain of {name} (") and "chain intact" in line
            for line in checked.stdout.splitlines()
        ), checked.stdout
    with connect(pair.store_url) as conn:
        kept_text = conn.execute(f"SELECT string_agg(line, '') FROM \"{pair.schema}\".audit_lines")
        assert PROVIDER_KEY not in str(kept_text.fetchone())
        first = next(
            line["seq"] for line in pair.lines(1, operation_id) if line["event"] == "polled"
        )
        conn.execute(
            f'UPDATE "{pair.schema}".audit_lines SET line = replace(line, \'"polled"\','
            " '\"refused\"') WHERE seq = %s AND chain = (SELECT chain FROM"
            f' "{pair.schema}".audit_chains WHERE replica = %s)',
            (first, REPLICAS[1]),
        )
    tampered = statusgate("audit", "verify", "--config", str(pair.configs[0]))
    assert tampered.returncode == 1, tampered.stdout
    said = tampered.stdout.splitlines()
    assert any(
        line.startswith("postgresql audit chain of replica-b")
        and f"chain broken at seq {first}: hash does not match" in line
        for line in said
    ), said
    assert any(line.startswith("postgresql audit chain of replica-a") for line in said), said
    assert "Traceback" not in tampered.stderr


def write_lines(path: Path, lines: list[tuple[str, str, str]]) -> None:
    """Audit lines (at, operation, event) appended by the gateway's own writer."""

    async def write() -> None:
        log = AuditLog(path, key=None)
        log.open()
        for at, operation_id, event in lines:
            await log.append({"at": at, "operation_id": operation_id, "event": event})
        await log.close()

    asyncio.run(write())


def test_story_from_files_merges_replicas_and_names_a_broken_chain(tmp_path: Path) -> None:
    """``audit story --from A --from B OP`` tells both files' lines of OP in time order, each
    naming its file; a file whose chain was altered is named with the broken seq (exit 1,
    nothing told, no traceback); so is a file that cannot be read."""
    a, b = tmp_path / "a" / "audit.jsonl", tmp_path / "b-audit.jsonl"
    write_lines(
        a,
        [
            ("2026-12-01T10:00:00.000Z", "op_1", "submitted"),
            ("2026-12-01T10:00:02.000Z", "op_2", "submitted"),
            ("2026-12-01T10:00:04.000Z", "op_1", "polled"),
        ],
    )
    write_lines(
        b,
        [
            ("2026-12-01T10:00:01.000Z", "op_1", "polled"),
            ("2026-12-01T10:00:05.000Z", "op_1", "abandoned"),
        ],
    )
    told = statusgate("audit", "story", "--from", str(a), "--from", str(b), "op_1")
    assert told.returncode == 0, told.stderr
    lines = told.stdout.splitlines()
    assert [line[:8] for line in lines] == ["10:00:00", "10:00:01", "10:00:04", "10:00:05"]
    names = [line.rsplit(" (replica ", 1)[1] for line in lines]
    assert names == ["audit.jsonl)", "b-audit.jsonl)", "audit.jsonl)", "b-audit.jsonl)"]
    assert lines[0].split(" ", 1)[1].startswith("submitted")

    altered = b.read_text().replace('"abandoned"', '"resumed"')
    b.write_text(altered)
    broken = statusgate("audit", "story", "--from", str(a), "--from", str(b), "op_1")
    assert broken.returncode == 1 and broken.stdout == ""
    assert f"{b}: chain broken at seq 2: hash does not match" in broken.stderr
    assert "Traceback" not in broken.stderr
    missing = statusgate("audit", "story", "--from", str(tmp_path / "gone.jsonl"), "op_1")
    assert missing.returncode == 1 and "gone.jsonl: cannot read" in missing.stderr
    assert "Traceback" not in missing.stderr
    neither = statusgate("audit", "story", "op_1")
    assert neither.returncode == 1 and "--config" in neither.stderr


def test_the_mirror_finds_where_to_go_on_in_a_file(tmp_path: Path) -> None:
    """offset_after finds the start of the first line past any seq (a binary search over a
    file of lines of many lengths), and takes an unfinished last line as not shipped."""
    path = tmp_path / "audit.jsonl"
    write_lines(
        path,
        [
            (f"2026-12-01T10:00:{i % 60:02d}.000Z", f"op_{'x' * (i * 7 % 90)}", "polled")
            for i in range(120)
        ],
    )
    data = path.read_bytes()
    starts = [0] + [i + 1 for i, byte in enumerate(data) if byte == ord("\n")]
    for seq in range(0, 121):
        assert offset_after(path, seq) == starts[seq], seq
    with path.open("ab") as handle:
        handle.write(b'{"seq":121,"at":')  # a line being written
    assert offset_after(path, 120) == len(data)


@pytest.fixture
async def kept(postgres_url: str) -> AsyncIterator[Any]:
    """An opened PostgreSQL store (migrated: audit_lines is there)."""
    from gateway.store import store_from_url

    store = store_from_url(postgres_url)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


async def append(path: Path, lines: list[tuple[str, str]]) -> None:
    """(at, operation) lines appended by the gateway's own writer, as it goes on after a
    restart."""
    log = AuditLog(path, key=None)
    log.open()
    for at, operation_id in lines:
        await log.append({"at": at, "operation_id": operation_id, "event": "polled"})
    await log.close()


async def test_an_outage_loses_no_line_and_a_restart_goes_on(kept: Any, tmp_path: Path) -> None:
    """Lines written while the database cannot be reached wait in the file and are all
    shipped once it can; a mirror started again (a restarted gateway) ships only the lines
    the database has not got; the database chain then verifies with every line."""
    from gateway import StoreError
    from gateway.observe.stories import verify_chains
    from gateway.store import store_from_url

    path = tmp_path / "audit.jsonl"
    await append(path, [(f"2026-12-01T10:00:0{i}.000Z", "op_1") for i in range(5)])
    down = store_from_url("postgresql://postgres@127.0.0.1:1/none")  # nothing listens there
    assert down.audit_lines is not None
    with pytest.raises(StoreError):
        await AuditMirror(path, down.audit_lines, "r").ship_all()
    assert await AuditMirror(path, kept.audit_lines, "r").ship_all() == 5
    await append(path, [(f"2026-12-01T10:01:0{i}.000Z", "op_1") for i in range(3)])
    again = AuditMirror(path, kept.audit_lines, "r")
    assert await again.ship_all() == 3 and await again.ship_all() == 0
    [found] = await verify_chains(kept.audit_lines, None)
    assert found.verdict.intact and found.verdict.records == 8 and found.chain.last_seq == 8
    assert found.chain.replica == "r" and found.first == 1


async def test_purge_keeps_each_chain_one_verifiable_run(kept: Any, tmp_path: Path) -> None:
    """The purge forgets a chain's oldest lines written before the cutoff whose operation
    the store no longer holds, stops at the first line still kept, never takes a chain's
    last line; the rest verifies from where it now starts."""
    from gateway.observe.stories import verify_chains

    old, new = "2020-01-01T00:00:0{}.000Z", "2026-12-01T10:00:0{}.000Z"
    first = tmp_path / "a.jsonl"
    await append(first, [(old.format(i), "op_gone") for i in range(4)])
    await append(first, [(new.format(i), "op_gone") for i in range(2)])
    await append(first, [(old.format(9), "op_gone")])  # an old instant after a new one
    only_old = tmp_path / "b.jsonl"
    await append(only_old, [(old.format(i), "op_gone") for i in range(3)])
    for path, replica in ((first, "a"), (only_old, "b")):
        await AuditMirror(path, kept.audit_lines, replica).ship_all()
    cutoff = time.time() - 24 * 3600 * 365 * 3  # 2020 is past it, 2026 is not
    assert await kept.audit_lines.purge(cutoff, 1000) == 4 + 2
    verdicts = {found.chain.replica: found for found in await verify_chains(kept.audit_lines, None)}
    assert verdicts["a"].verdict.intact and verdicts["a"].first == 5
    assert verdicts["a"].verdict.records == 3
    assert verdicts["b"].verdict.intact and verdicts["b"].first == 3  # its last line stays
    assert await kept.audit_lines.purge(cutoff, 1000) == 0


async def test_migrate_upgrades_layout_1_with_the_audit_tables(postgres_base_url: str) -> None:
    """A database at layout 1 (the previous release) gets the audit tables from
    ``migrate``, its operations untouched, and the version recorded."""
    from gateway.store import store_from_url
    from gateway.store.postgres.layout import LAYOUT
    from gateway.store.postgres.statements import layout_sql

    schema = f"sgtest_up_{uuid.uuid4().hex[:10]}"
    base = postgres_base_url.split("?", 1)[0]
    try:
        with connect(base) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
            conn.execute(layout_sql(schema, 1))
            conn.execute(
                f'CREATE TABLE "{schema}".schema_version (version integer NOT NULL,'
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            conn.execute(f'INSERT INTO "{schema}".schema_version (version) VALUES (1)')
        store = store_from_url(f"{base}?schema={schema}")
        try:
            assert await store.migrate() == (1, LAYOUT)
        finally:
            await store.close()
        with connect(base) as conn:
            found = conn.execute(f"SELECT to_regclass('\"{schema}\".audit_lines')").fetchone()
            assert found is not None and found[0] is not None
    finally:
        drop_schema(base, schema)


async def test_a_role_without_rights_on_the_audit_tables_serves_and_loses_no_line(
    two_roles: tuple[str, str, str], tmp_path: Path
) -> None:
    """A serving role granted everything but the audit tables (an upgrade whose grants were
    not run again) serves a submit and polls as usual; once the owner grants the audit
    tables, every line of the gateway's file reaches the database, in one intact chain."""
    from gateway.observe.stories import verify_chains
    from gateway.store import store_from_url

    from conftest import real_time_harness

    owner_url, serving_url, serving = two_roles
    done = statusgate(
        "migrate", "--config", str(write_config(tmp_path / "o", "x", store=owner_url))
    )
    assert done.returncode == 0, done.stderr
    with connect(owner_url) as conn:
        conn.execute(roles.GRANTS.format(role=serving))
        conn.execute(f'REVOKE ALL ON public.audit_lines, public.audit_chains FROM "{serving}"')
    policy = {"demo-jobs": {"polling": {"base_delay": "100ms", "jitter": {"min": 1}}}}
    async with real_time_harness(
        tmp_path / "serve", store_url=serving_url, policy_changes=policy
    ) as harness:
        response = await harness.submit([{"state": "running"}, {"state": "succeeded"}])
        assert response.status == 202, await response.text()
        job = (await response.json())["id"]
        for _ in range(2):
            poll = await harness.poll_when_due(job)
            assert poll.status == 200, await poll.text()
        written = len(harness.audit_path.read_text().splitlines())
        with connect(owner_url) as conn:
            assert conn.execute("SELECT count(*) FROM public.audit_lines").fetchone() == (0,)
            conn.execute(f'GRANT ALL ON public.audit_lines, public.audit_chains TO "{serving}"')
        deadline = time.monotonic() + 60  # the mirror's backoff reaches 30 s at most
        while time.monotonic() < deadline:
            with connect(owner_url) as conn:
                row = conn.execute("SELECT count(*) FROM public.audit_lines").fetchone()
            if row == (written,):
                break
            await asyncio.sleep(0.2)
        assert row == (written,), (row, written)
    owner = store_from_url(owner_url)
    await owner.open()
    try:
        [found] = await verify_chains(owner.audit_lines, None)
    finally:
        await owner.close()
    assert found.verdict.intact and found.verdict.records == written and found.first == 1


async def test_a_malformed_line_in_the_database_is_skipped_and_said(
    postgres_url: str, tmp_path: Path
) -> None:
    """Lines of the operation kept in the database that cannot be told (a seq that is not a
    number, missing fields, not a JSON object, an instant that is a number) are left out of
    the admin API's story and counted in its note; the view still answers 200 with every
    good line."""
    async with real_time_harness(tmp_path, store_url=postgres_url) as harness:
        submitted = await harness.submit([{"state": "running"}])
        operation = submitted.headers["Statusgate-Operation"]
        path = f"/admin/operations/{operation}"
        good = await (await harness.client.get(path, headers=ADMIN)).json()
        assert good["story_note"] is None and len(good["story"]) == 1
        bad = [
            {"seq": "x", "at": "2026-12-01T10:00:00.000Z", "operation_id": operation},
            {"operation_id": operation},
            [operation],
            {"seq": 4, "at": 5, "operation_id": operation, "event": "polled"},
        ]
        schema = postgres_url.rsplit("schema=", 1)[1].split("&", 1)[0]
        with connect(postgres_url) as conn:
            conn.execute(
                f'INSERT INTO "{schema}".audit_chains VALUES (%s, %s, %s, 0)',
                ("tampered00000000", "replica-t", len(bad)),
            )
            for seq, line in enumerate(bad, start=1):
                conn.execute(
                    f'INSERT INTO "{schema}".audit_lines VALUES (%s, %s, 0, %s, %s)',
                    ("tampered00000000", seq, operation, json.dumps(line)),
                )
        shown = await harness.client.get(path, headers=ADMIN)
        assert shown.status == 200, await shown.text()
        body = await shown.json()
        assert body["story"] == good["story"]
        assert body["story_note"] == "4 lines unreadable (left out)"


async def kept_of(kept: Any, operation_id: str) -> list[Any]:
    found: list[Any] = await kept.audit_lines.of_operation(operation_id)
    return found


async def test_a_truncated_or_replaced_file_is_shipped_as_a_new_chain(
    kept: Any, tmp_path: Path
) -> None:
    """One mirror goes on shipping after its file is truncated in place (logrotate's
    copytruncate; the writer goes on with the next seq, even past where the mirror had
    read) and after it is replaced by a new file (renamed, a new writer from seq 1): each
    is a new chain from its first line, every line reaches the database and every chain
    verifies."""
    from gateway.observe.stories import verify_chains

    path = tmp_path / "audit.jsonl"
    log = AuditLog(path, key=None)
    log.open()
    mirror = AuditMirror(path, kept.audit_lines, "r")
    for i in range(3):
        await log.append({"at": f"2026-12-01T10:00:0{i}.000Z", "operation_id": "op_a"})
    assert await mirror.ship_all() == 3
    (tmp_path / "audit.jsonl.1").write_bytes(path.read_bytes())  # copytruncate
    os.truncate(path, 0)
    for i in range(6):  # more bytes than the mirror had read before the truncation
        await log.append({"at": f"2026-12-01T10:01:0{i}.000Z", "operation_id": "op_b"})
    assert await mirror.ship_all() == 6
    await log.close()
    path.rename(tmp_path / "audit.jsonl.2")  # replaced: renamed, a new writer
    log = AuditLog(path, key=None)
    log.open()
    await log.append({"at": "2026-12-01T10:02:00.000Z", "operation_id": "op_c"})
    assert await mirror.ship_all() == 1
    await log.close()

    chains = [{row.chain for row in await kept_of(kept, op)} for op in ("op_a", "op_b", "op_c")]
    assert [len(found) for found in chains] == [1, 1, 1]
    assert len(set.union(*chains)) == 3
    assert [len(await kept_of(kept, op)) for op in ("op_a", "op_b", "op_c")] == [3, 6, 1]
    verdicts = await verify_chains(kept.audit_lines, None)
    assert sorted(v.verdict.records for v in verdicts) == [1, 3, 6]
    assert all(v.verdict.intact for v in verdicts), verdicts


async def test_a_running_mirror_follows_a_truncated_file(kept: Any, tmp_path: Path) -> None:
    """The mirror in the background, woken by the writer as in the gateway: after the file
    is truncated in place, the lines written next reach the database."""
    path = tmp_path / "audit.jsonl"
    log, mirror = running_mirror(path, kept)
    try:
        for i in range(5):
            await log.append({"at": f"2026-12-01T10:00:0{i}.000Z", "operation_id": "op_a"})
        await until(lambda: kept_of(kept, "op_a"), 5)
        os.truncate(path, 0)
        await log.append({"at": "2026-12-01T10:01:00.000Z", "operation_id": "op_b"})
        await until(lambda: kept_of(kept, "op_b"), 1)
    finally:
        await mirror.close()
        await log.close()


def running_mirror(path: Path, kept: Any, clock: Any = None) -> tuple[AuditLog, AuditMirror]:
    """A writer on ``path`` and its mirror into ``kept`` running in the background, woken
    by each line as in the gateway (close both when done)."""
    log = AuditLog(path, key=None) if clock is None else AuditLog(path, key=None, clock=clock)
    log.open()
    mirror = AuditMirror(path, kept.audit_lines, "r")
    log.on_written = mirror.nudge
    mirror.start()
    return log, mirror


async def until(read: Any, count: int) -> None:
    """Wait (30 s at most: a loaded machine) until ``read()`` finds ``count`` lines."""
    deadline = time.monotonic() + 30
    while len(await read()) < count:
        assert time.monotonic() < deadline, "the lines never reached the database"
        await asyncio.sleep(0.05)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_file_renamed_before_its_first_batch_reaches_the_database(
    kept: Any, tmp_path: Path
) -> None:
    """The mirror looked while the file was still empty (a gateway just started); lines are
    written and the file renamed away before its next batch (a worker's lines wake the
    shipper only within a second). The mirror still holds the renamed file: its lines reach
    the database, then the successor's, as two chains."""
    from gateway.observe.audit import LOOK_SECONDS

    path, clock = tmp_path / "audit.jsonl", Clock()
    log = AuditLog(path, key=None, clock=clock)
    log.open()
    mirror = AuditMirror(path, kept.audit_lines, "r")
    assert await mirror.ship_all() == 0  # nothing written yet
    for n in range(3):
        await log.append({"at": f"2026-12-01T10:00:0{n}.000Z", "operation_id": f"op_{n}"})
    path.rename(tmp_path / "audit.jsonl.1")
    clock.now += LOOK_SECONDS
    for n in range(3, 5):
        await log.append({"at": f"2026-12-01T10:00:0{n}.000Z", "operation_id": f"op_{n}"})
    assert await mirror.ship_all() == 5
    await log.close()
    kept_lines = [await kept_of(kept, f"op_{n}") for n in range(5)]
    assert [len(found) for found in kept_lines] == [1] * 5
    chains = [found[0].chain for found in kept_lines]
    assert len(set(chains[:3])) == 1 and len(set(chains[3:])) == 1 and chains[0] != chains[3]


@pytest.mark.parametrize("create", [True, False], ids=["create", "nocreate"])
async def test_lines_written_before_a_rename_reach_the_database(
    kept: Any, tmp_path: Path, create: bool
) -> None:
    """logrotate renames the file (and makes an empty one at the path, or none) after lines
    the mirror has not shipped yet; more go into the renamed file before the writer looks
    (LOOK_SECONDS, injected clock). The mirror ships all of them from the renamed file, and
    the writer's next lines, at the path, as a new chain: none lost, none twice, and both
    chains verify in the database."""
    from gateway.observe.audit import LOOK_SECONDS
    from gateway.observe.stories import verify_chains

    path, clock = tmp_path / "audit.jsonl", Clock()
    log = AuditLog(path, key=None, clock=clock)
    log.open()
    mirror = AuditMirror(path, kept.audit_lines, "r")

    async def write(first: int, count: int) -> None:
        for n in range(first, first + count):
            await log.append({"at": f"2026-12-01T10:00:{n:02}.000Z", "operation_id": f"op_{n}"})

    await write(0, 3)
    assert await mirror.ship_all() == 3
    await write(3, 2)  # after the last batch
    path.rename(tmp_path / "audit.jsonl.1")
    if create:
        path.touch()
    await write(5, 1)  # the writer has not looked yet: into the renamed file
    assert await mirror.ship_all() == 3  # no line at the path yet: the renamed file's
    clock.now += LOOK_SECONDS
    await write(6, 2)  # at the path
    await write(8, 1)
    assert await mirror.ship_all() == 3
    await log.close()

    kept_lines = [await kept_of(kept, f"op_{n}") for n in range(9)]
    assert [len(found) for found in kept_lines] == [1] * 9
    chains = [found[0].chain for found in kept_lines]
    assert len(set(chains[:6])) == 1 and len(set(chains[6:])) == 1 and chains[0] != chains[6]
    verdicts = await verify_chains(kept.audit_lines, None)
    assert sorted((v.first, v.verdict.records) for v in verdicts) == [(1, 6), (7, 3)]
    assert all(v.verdict.intact for v in verdicts), verdicts


async def test_a_running_mirror_follows_a_rename_of_a_running_writer(
    kept: Any, tmp_path: Path
) -> None:
    """The mirror in the background, woken by the writer as in the gateway: lines written
    just before a rename (no batch between: the same turn of the loop) and after it all
    reach the database."""
    from gateway.observe.audit import LOOK_SECONDS

    path, clock = tmp_path / "audit.jsonl", Clock()
    log, mirror = running_mirror(path, kept, clock)
    try:
        for i in range(5):
            await log.append({"at": f"2026-12-01T10:00:0{i}.000Z", "operation_id": "op_a"})
            if i == 1:  # the mirror has the file open, and these two
                await until(lambda: kept_of(kept, "op_a"), 2)
        path.rename(tmp_path / "audit.jsonl.1")  # on the same turn of the loop: unshipped
        clock.now += LOOK_SECONDS
        await log.append({"at": "2026-12-01T10:01:00.000Z", "operation_id": "op_b"})
        await until(lambda: kept_of(kept, "op_b"), 1)
        await until(lambda: kept_of(kept, "op_a"), 5)
    finally:
        await mirror.close()
        await log.close()
    assert len(await kept_of(kept, "op_a")) == 5

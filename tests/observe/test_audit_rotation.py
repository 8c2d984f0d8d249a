"""The audit log under logrotate: renamed away (``create``, ``nocreate``) the writer goes on
at the path with the next seq, truncated in place (``copytruncate``) it goes on at the
file's start; either way each file verifies with ``statusgate audit verify``, the new one
from its first line (marked ``rotated``) and, named together, as the continuation of the
old one. Writers alone (time injected), shared (``serve --workers``), and a real gateway
process, alone and with two workers, renamed while it writes."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.demo.provider import DemoProvider
from gateway.observe.audit import LOOK_SECONDS, AuditLog, Fsync
from gateway.run.cli import main

from conftest import AGENT_TOKEN, Served

AUTH = {"Authorization": f"Bearer {AGENT_TOKEN}"}


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out + err


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in path.read_bytes().splitlines()]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def rotate(path: Path, mode: str) -> Path:
    """What logrotate does to ``path`` in ``mode``; the rotated file."""
    rotated = path.with_name(path.name + ".1")
    if mode == "copytruncate":
        rotated.write_bytes(path.read_bytes())
        os.truncate(path, 0)
        return rotated
    path.rename(rotated)
    if mode == "create":
        path.touch()
    return rotated


def assert_one_chain(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> None:
    """``new`` takes up where ``old`` ends: seqs 1.. without a gap or a repeat, the new
    file's first line marked and chained onto the old file's last."""
    seqs = [line["seq"] for line in old + new]
    assert seqs == list(range(1, len(seqs) + 1))
    assert new[0]["rotated"] is True and new[0]["prev"] == old[-1]["hash"]
    assert not any("rotated" in line for line in old + new[1:])


@pytest.mark.parametrize("mode", ["create", "nocreate", "copytruncate"])
async def test_a_rotated_file_goes_on_at_the_path_and_both_verify(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], mode: str
) -> None:
    """Renamed away, the writer's lines go on into the renamed file until it next looks
    (LOOK_SECONDS on its clock), then at the path, with the next seq; truncated, at the
    file's start. `audit verify` passes each file alone and the two named together."""
    path, clock = tmp_path / "audit.jsonl", Clock()
    log = AuditLog(path, key=None, fsync=Fsync.BATCH, clock=clock)
    log.open()
    for n in range(3):
        await log.append({"event": "polled", "n": n})
    rotated = rotate(path, mode)
    await log.append({"event": "polled", "n": 3})  # before the writer looks: the old file
    clock.now += LOOK_SECONDS
    for n in range(4, 7):
        await log.append({"event": "polled", "n": n})
    await log.close()

    old, new = lines(rotated), lines(path)
    if mode == "copytruncate":  # the line written before the writer looked is at the path
        assert [line["n"] for line in old] == [0, 1, 2]
        assert [line["n"] for line in new] == [3, 4, 5, 6]
    else:
        assert [line["n"] for line in old] == [0, 1, 2, 3]
        assert [line["n"] for line in new] == [4, 5, 6]
    assert_one_chain(old, new)
    first = new[0]["seq"]
    code, out = run(["audit", "verify", str(path)], capsys)
    assert code == 0, out
    said = f"{len(new)} records from seq {first} (continues a rotated file not named here)"
    assert out == f"{path}: {said}, chain intact\n"
    code, out = run(["audit", "verify", str(rotated), str(path)], capsys)
    assert code == 0, out
    assert out.splitlines() == [
        f"{rotated}: {len(old)} records, chain intact",
        f"{path}: {len(new)} records from seq {first} (continues {rotated}), chain intact",
    ]


async def test_a_rotated_file_named_with_a_file_it_does_not_continue_is_broken(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Named with a file that ends at the seq before its first but with another hash (the
    rotated file replaced by another chain's), the new file is reported broken there; a
    file whose first lines were cut off (no ``rotated`` mark) is broken at seq 1."""
    path, clock = tmp_path / "audit.jsonl", Clock()
    log = AuditLog(path, key=None, fsync=Fsync.NEVER, clock=clock)
    log.open()
    for n in range(5):
        await log.append({"event": "polled", "n": n})
    rotated = rotate(path, "create")
    clock.now += LOOK_SECONDS
    await log.append({"event": "polled", "n": 5})
    await log.close()
    other = AuditLog(tmp_path / "other.jsonl", key=None, fsync=Fsync.NEVER)
    other.open()
    for n in range(5):
        await other.append({"event": "polled", "n": n + 100})
    await other.close()

    code, out = run(["audit", "verify", str(other.path), str(path)], capsys)
    assert code == 1
    assert out.splitlines()[1] == (
        f"{path}: chain broken at seq 6: its prev is not the hash of seq 5 in {other.path}"
    )
    cut = rotated.read_bytes().splitlines(keepends=True)
    rotated.write_bytes(b"".join(cut[2:]))  # its first two lines deleted
    code, out = run(["audit", "verify", str(rotated)], capsys)
    assert code == 1
    assert out == f"{rotated}: chain broken at seq 1: expected seq 1, found 3\n"


async def test_shared_writers_follow_a_rename_as_one_chain(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three writers in shared mode (serve --workers), appending in turn: after a rename,
    none writes into the renamed file any more, whichever writes first at the path, and
    the two files are one chain (no seq twice, none missing)."""
    path = tmp_path / "audit.jsonl"
    writers = [AuditLog(path, key=None, fsync=Fsync.NEVER, shared=True) for _ in range(3)]
    for writer in writers:
        writer.open()
    for n in range(10):
        await writers[n % 3].append({"event": "polled", "n": n})
    rotated = rotate(path, "nocreate")
    for n in range(10, 20):
        await writers[(n * 2) % 3].append({"event": "polled", "n": n})
    for writer in writers:
        await writer.close()

    old, new = lines(rotated), lines(path)
    assert [line["n"] for line in old] == list(range(10))
    assert [line["n"] for line in new] == list(range(10, 20))
    assert_one_chain(old, new)
    code, out = run(["audit", "verify", str(rotated), str(path)], capsys)
    assert code == 0, out


async def test_a_shared_writer_idle_across_two_rotations_follows_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A worker that writes nothing across two rotations (its agents on other workers) is
    moved along by ``follow`` (the sweeper calls it once a second), so its first line after
    the second rotation takes up the chain's end, not the end of the file it had open."""
    path = tmp_path / "audit.jsonl"
    busy, idle = (AuditLog(path, key=None, fsync=Fsync.NEVER, shared=True) for _ in range(2))
    busy.open()
    idle.open()
    await idle.append({"event": "polled", "n": 0})
    await busy.append({"event": "polled", "n": 1})
    first = path.rename(path.with_name("audit.jsonl.2"))
    await busy.append({"event": "polled", "n": 2})
    idle.follow()
    second = path.rename(path.with_name("audit.jsonl.1"))
    path.touch()
    idle.follow()
    await idle.append({"event": "polled", "n": 3})
    await busy.append({"event": "polled", "n": 4})
    for writer in (busy, idle):
        await writer.close()
    seqs = [line["seq"] for f in (first, second, path) for line in lines(f)]
    assert seqs == [1, 2, 3, 4, 5]
    code, out = run(["audit", "verify", str(first), str(second), str(path)], capsys)
    assert code == 0, out


@pytest.mark.parametrize(
    ("kind", "workers"), [("sqlite", 1), ("redis", 2), ("postgres", 2)], ids=str
)
async def test_a_gateway_renamed_while_it_writes_goes_on_at_the_path(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    upstream: tuple[DemoProvider, str],
    gateways: list[Served],
    request: pytest.FixtureRequest,
    kind: str,
    workers: int,
) -> None:
    """A real `statusgate serve` (alone on SQLite; two workers on Redis, and on PostgreSQL)
    takes submissions while its audit file is renamed away (logrotate's ``create``): the
    lines after it reach a file at the path, the renamed file keeps those before, each
    verifies and the two are one chain, with every submission's line once. On PostgreSQL
    every line of both files reaches the database, as two chains that verify."""
    _, url = upstream
    store = None if kind == "sqlite" else str(request.getfixturevalue(f"{kind}_url"))
    args = ["--workers", str(workers)] if workers > 1 else []
    served = Served(tmp_path / "g", url, tmp_path / "g.db", store_url=store, args=args)
    await served.up()
    gateways.append(served)
    path = served.folder / "audit.jsonl"
    base = f"http://127.0.0.1:{served.port}"
    made = 0
    connector = aiohttp.TCPConnector(force_close=True)  # a connection each: both workers serve

    try:
        async with aiohttp.ClientSession(connector=connector) as http:

            async def submit() -> None:
                nonlocal made
                headers = {**AUTH, "Idempotency-Key": f"k{made}"}
                post = http.post(f"{base}/p/demo-jobs/v1/jobs", json={}, headers=headers)
                async with post as r:
                    assert r.status == 202, await r.text()
                made += 1

            for _ in range(10):
                await submit()
            rotated = rotate(path, "create")
            deadline = asyncio.get_running_loop().time() + 30
            while path.stat().st_size == 0:  # until a writer looked (LOOK_SECONDS alone)
                assert asyncio.get_running_loop().time() < deadline, "nothing at the path"
                await submit()
            for _ in range(10):
                await submit()
        if kind == "postgres":
            await shipped_all(str(store), rotated, path)
    finally:
        stderr = served.stop()  # SIGTERM: the workers too
    assert "Traceback" not in stderr

    old, new = lines(rotated), lines(path)
    assert_one_chain(old, new)
    submitted = [line for line in old + new if line["event"] == "submitted"]
    assert len(submitted) == made
    assert len({line["operation_id"] for line in submitted}) == made
    code, out = run(["audit", "verify", str(rotated), str(path)], capsys)
    assert code == 0, out
    code, out = run(["audit", "verify", str(path)], capsys)
    assert code == 0, out


async def shipped_all(store_url: str, *paths: Path) -> None:
    """Wait (30 s at most: a loaded machine; worker 0 ships the other worker's lines within
    a second) until the database keeps every line of the files, one chain a file, each
    intact."""
    from gateway.observe.stories import verify_chains
    from gateway.store import store_from_url

    store = store_from_url(store_url)
    await store.open()
    try:
        assert store.audit_lines is not None
        deadline = asyncio.get_running_loop().time() + 30
        while True:
            verdicts = await verify_chains(store.audit_lines, None)
            kept = sorted(v.verdict.records for v in verdicts)
            written = sorted(len(lines(path)) for path in paths)
            if kept == written:
                break
            assert asyncio.get_running_loop().time() < deadline, (kept, written)
            await asyncio.sleep(0.1)
        assert all(v.verdict.intact for v in verdicts), verdicts
    finally:
        await store.close()


async def test_a_path_that_cannot_be_made_again_keeps_the_lines_in_the_renamed_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Its folder renamed away too, the path cannot be made: the writer says so once and
    goes on in the renamed file (no line refused), and at the path once it can."""
    folder, clock = tmp_path / "var", Clock()
    log = AuditLog(folder / "audit.jsonl", key=None, fsync=Fsync.NEVER, clock=clock)
    log.open()
    await log.append({"event": "polled", "n": 0})
    folder.rename(tmp_path / "var.old")
    for n in (1, 2):
        clock.now += LOOK_SECONDS
        assert await log.append({"event": "polled", "n": n}) is not None
    said = [r.getMessage() for r in caplog.records if "cannot be made again" in r.getMessage()]
    assert len(said) == 1
    folder.mkdir()
    clock.now += LOOK_SECONDS
    await log.append({"event": "polled", "n": 3})
    await log.close()
    old, new = lines(tmp_path / "var.old" / "audit.jsonl"), lines(folder / "audit.jsonl")
    assert [line["n"] for line in old] == [0, 1, 2] and [line["n"] for line in new] == [3]
    assert_one_chain(old, new)


async def test_two_replicas_rotated_files_named_together_each_find_their_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two replicas' files rotated at the same seq, named in one `audit verify`: each new
    file is checked against the rotated file it continues (the one whose last hash it
    takes up), not the other replica's that ends at the same seq; all four verify."""
    named: list[Path] = []
    for replica in ("a", "b"):
        folder, clock = tmp_path / replica, Clock()
        log = AuditLog(folder / "audit.jsonl", key=None, fsync=Fsync.NEVER, clock=clock)
        log.open()
        for n in range(3):
            await log.append({"event": "polled", "n": n, "replica": replica})
        rotated = rotate(log.path, "create")
        clock.now += LOOK_SECONDS
        await log.append({"event": "polled", "n": 3, "replica": replica})
        await log.close()
        named += [rotated, log.path]
    code, out = run(["audit", "verify", *map(str, named)], capsys)
    assert code == 0, out
    assert out.splitlines()[3] == (
        f"{named[3]}: 1 records from seq 4 (continues {named[2]}), chain intact"
    )


class HeldThreads(concurrent.futures.ThreadPoolExecutor):
    """The loop's threads, each call held until ``go`` is set: an fsync still under way."""

    def __init__(self) -> None:
        super().__init__(2)
        self.go = threading.Event()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        def held() -> Any:
            self.go.wait(30)
            return fn(*args, **kwargs)

        return super().submit(held)


async def test_a_rename_followed_while_an_fsync_is_under_way_refuses_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A line's fsync (on a thread) still under way when another line follows a rename:
    the renamed file is left (closed) without the fsync failing on its descriptor, so no
    "cannot be written" error is logged and both lines are on file, one chain."""
    path, clock = tmp_path / "audit.jsonl", Clock()
    log = AuditLog(path, key=None, fsync=Fsync.ALWAYS, clock=clock)
    log.open()
    threads = HeldThreads()
    asyncio.get_running_loop().set_default_executor(threads)
    first = asyncio.create_task(log.append({"event": "polled", "n": 0}))
    await asyncio.sleep(0)  # written; its fsync waits on a thread
    rotated = rotate(path, "create")
    clock.now += LOOK_SECONDS
    second = asyncio.create_task(log.append({"event": "polled", "n": 1}))
    await asyncio.sleep(0)  # the rename followed: the renamed file's descriptor closed
    threads.go.set()
    assert await first is not None and await second is not None
    assert log.writable()
    await log.close()
    said = [r.getMessage() for r in caplog.records if "cannot be written" in r.getMessage()]
    assert said == []
    assert_one_chain(lines(rotated), lines(path))

"""The SQLite store's fsync process (store/sqlite/wal_sync.py, fsync_helper.py),
run for real: fsyncs answered, a disk error named by its errno, a killed helper replaced,
an fsync made on a thread while none can start, and the store failing only the writes whose
fsync was lost."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gateway import StoreError
from gateway.core.models import OperationRecord
from gateway.store import SQLiteStore
from gateway.store.sqlite.fsync_helper import READY
from gateway.store.sqlite.wal_sync import PROGRAM, RESTART_WAIT, HelperLost, WalSyncer

from conftest import pending_record


def op(number: int) -> OperationRecord:
    return pending_record(operation_id=f"op_{number}", provider_job_id=f"job_{number}")


def synced(syncer: WalSyncer) -> asyncio.Future[None]:
    """One ``sync`` as a future: its result when the fsync succeeded, else its error."""
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def done(error: BaseException | None) -> None:
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)

    syncer.sync(done)
    return future


def gone(pid: int) -> bool:
    """The process ``pid`` has ended and been reaped (no zombie left behind)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def held_by(pid: int, path: Path) -> list[str]:
    """What the descriptors of process ``pid`` that name ``path`` point to."""
    folder = Path(f"/proc/{pid}/fd")
    found = [os.readlink(folder / fd) for fd in os.listdir(folder)]
    return [target for target in found if target.startswith(str(path))]


async def test_a_sync_is_an_fsync_made_by_a_helper_process_ended_at_close(tmp_path: Path) -> None:
    """Each sync is answered by a process of its own (not a thread of the gateway's), which
    holds the file open; close ends and reaps it."""
    wal = tmp_path / "g.db-wal"
    wal.write_bytes(b"frames")
    syncer = WalSyncer(str(wal))
    syncer.start()
    pid = syncer.pid
    assert pid is not None and pid != os.getpid()
    for _ in range(3):
        await asyncio.wait_for(synced(syncer), 5)
    assert held_by(pid, wal) == [str(wal)]
    await syncer.close()
    assert gone(pid)


async def test_a_failed_fsync_is_an_oserror_with_the_disks_errno(tmp_path: Path) -> None:
    """What the helper could not fsync comes back as the OSError it met (here: no such
    file), so the store can name it; the helper lives on."""
    syncer = WalSyncer(str(tmp_path / "missing-wal"))
    syncer.start()
    try:
        with pytest.raises(OSError) as raised:
            await asyncio.wait_for(synced(syncer), 5)
        assert raised.value.errno == errno.ENOENT
        assert raised.value.strerror == os.strerror(errno.ENOENT)
        (tmp_path / "missing-wal").write_bytes(b"")
        await asyncio.wait_for(synced(syncer), 5)
    finally:
        await syncer.close()


async def test_a_replaced_file_is_opened_again(tmp_path: Path) -> None:
    """A WAL SQLite unlinked and made anew is fsynced as the new file, not the old inode."""
    wal = tmp_path / "g.db-wal"
    wal.write_bytes(b"old")
    syncer = WalSyncer(str(wal))
    syncer.start()
    try:
        await asyncio.wait_for(synced(syncer), 5)
        wal.unlink()
        wal.write_bytes(b"new")
        await asyncio.wait_for(synced(syncer), 5)
        assert syncer.pid is not None and held_by(syncer.pid, wal) == [str(wal)]
    finally:
        await syncer.close()


async def test_a_helper_killed_idle_is_replaced_and_one_killed_mid_fsync_is_reported(
    tmp_path: Path,
) -> None:
    """A helper killed while idle is replaced at the next sync, which succeeds: nothing was
    asked of it. One killed with an fsync asked of it fails that sync with HelperLost
    ``in_flight`` (whether it ran is unknown); the next sync starts a new helper."""
    wal = tmp_path / "g.db-wal"
    wal.write_bytes(b"frames")
    syncer = WalSyncer(str(wal))
    syncer.start()
    idle = syncer.pid
    assert idle is not None
    os.kill(idle, signal.SIGKILL)
    while not gone(idle) and syncer.pid == idle:
        await asyncio.sleep(0.01)
    try:
        await asyncio.wait_for(synced(syncer), 5)
        busy = syncer.pid
        assert busy not in (None, idle)
        assert busy is not None
        os.kill(busy, signal.SIGSTOP)  # it cannot answer: the fsync asked stays in flight
        asked = synced(syncer)
        os.kill(busy, signal.SIGKILL)
        with pytest.raises(HelperLost, match="fsync process") as raised:
            await asyncio.wait_for(asked, 5)
        assert raised.value.in_flight
        while not gone(busy):  # reaped off the loop, which never waits for it
            await asyncio.sleep(0.01)
        await asyncio.wait_for(synced(syncer), 5)
        assert syncer.pid not in (None, busy)
    finally:
        await syncer.close()


def test_the_helper_says_ready_ignores_signals_and_exits_when_its_input_ends(
    tmp_path: Path,
) -> None:
    """The helper's first byte says it is ready; a Ctrl-C, a stop or a reload signal leaves
    it there for the gateway's fsyncs; it exits (status 0) once the gateway closes its
    input, or dies."""
    wal = tmp_path / "g.db-wal"
    wal.write_bytes(b"frames")
    helper = subprocess.Popen(
        [sys.executable, "-I", "-S", str(PROGRAM), str(wal)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert helper.stdin is not None and helper.stdout is not None
    assert helper.stdout.read(1) == READY
    helper.stdin.write(b"s")
    helper.stdin.flush()
    assert helper.stdout.read(1) == b"\x00"
    for sent in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        helper.send_signal(sent)
        helper.stdin.write(b"s")
        helper.stdin.flush()
        assert helper.stdout.read(1) == b"\x00"
    helper.stdin.close()
    assert helper.wait(5) == 0
    helper.stdout.close()


async def _lost_under(store: SQLiteStore, syncer: WalSyncer, record: OperationRecord) -> None:
    """Stop the helper, let a durable write ask it for an fsync, kill it: that write fails."""
    pid = syncer.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)  # it cannot answer: the fsync asked stays in flight
    saving = asyncio.ensure_future(store.save(record))
    while syncer._asked is None:
        await asyncio.sleep(0.001)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(StoreError, match="fsync process"):
        await asyncio.wait_for(saving, 5)


async def test_a_helper_lost_mid_fsync_stops_the_store_and_one_that_cannot_start_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A helper that cannot be started was asked nothing: the fsync is made on a thread, so
    the durable write waiting for it succeeds (it is committed: refusing it would tell the
    agent that a saved write failed) and a warning names why; once a helper starts again
    the fsyncs are its own. A helper killed with an fsync in flight leaves that fsync's
    outcome (and any disk error it met) unknown: the store stops until a restart, as after
    a failed fsync."""
    caplog.set_level(logging.INFO, logger="statusgate")
    store = SQLiteStore(str(tmp_path / "g.db"))
    await store.open()
    try:
        first = await store.create(op(1))
        syncer = store._syncer
        assert isinstance(syncer, WalSyncer) and syncer.pid is not None
        real_popen = subprocess.Popen

        def no_process(*args: object, **kwargs: object) -> None:
            raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

        monkeypatch.setattr(subprocess, "Popen", no_process)
        idle = syncer.pid
        os.kill(idle, signal.SIGKILL)
        while not gone(idle) and syncer.pid == idle:
            await asyncio.sleep(0.01)
        assert await store.save(first)
        assert syncer.pid is None
        current = await store.get("op_1")
        assert current is not None and current.version == first.version + 1
        assert await store.save(current)  # within RESTART_WAIT: on a thread, not warned again
        warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert warned == [
            "cannot start the fsync process: Resource temporarily unavailable; fsyncs of "
            f"{tmp_path / 'g.db'}-wal are made in the gateway until one starts"
        ]
        monkeypatch.setattr(subprocess, "Popen", real_popen)
        await asyncio.sleep(RESTART_WAIT)
        current = await store.get("op_1")
        assert current is not None and await store.save(current)
        assert syncer.pid is not None
        assert f"the fsync process of {tmp_path / 'g.db'}-wal started again" in caplog.text
        current = await store.get("op_1")
        assert current is not None
        await _lost_under(store, syncer, current)
        with pytest.raises(StoreError, match="until the gateway restarts"):
            await store.create(op(2))
    finally:
        monkeypatch.undo()
        await store.close()


async def test_without_a_process_or_a_thread_the_fsync_is_made_on_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A machine out of process slots is often out of threads too: the fsync is then made
    on the loop itself (a blocking fsync, better than a write that never hears back), and
    its outcome still reaches the caller."""
    wal = tmp_path / "g.db-wal"
    wal.write_bytes(b"frames")
    syncer = WalSyncer(str(wal))
    loop = asyncio.get_running_loop()

    def no_process(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    def no_thread(*args: object, **kwargs: object) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(subprocess, "Popen", no_process)
    monkeypatch.setattr(loop, "run_in_executor", no_thread)
    await asyncio.wait_for(synced(syncer), 5)
    wal.unlink()  # an error still comes back as its OSError (here: the file is gone)
    syncer._file.close()
    with pytest.raises(FileNotFoundError):
        await asyncio.wait_for(synced(syncer), 5)
    await syncer.close()


async def test_a_helper_that_dies_as_it_starts_was_asked_nothing(tmp_path: Path) -> None:
    """A helper that ends before its ready byte never read the request: that fsync is made
    on a thread and succeeds (not an fsync of unknown outcome, which would stop the store)."""
    wal = tmp_path / "g.db-wal"
    wal.write_bytes(b"frames")
    syncer = WalSyncer(str(wal))
    real_popen = subprocess.Popen

    def dying(args: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
        return real_popen([sys.executable, "-c", "import os; os._exit(3)"], **kwargs)  # type: ignore[call-overload,no-any-return]

    try:
        subprocess.Popen = dying  # type: ignore[assignment,misc]
        asked = synced(syncer)
    finally:
        subprocess.Popen = real_popen  # type: ignore[misc]
    await asyncio.wait_for(asked, 5)
    await asyncio.wait_for(synced(syncer), 5)  # a real helper now
    assert syncer.pid is not None
    await syncer.close()


async def test_a_store_closed_while_its_helper_is_lost_answers_every_waiting_write(
    tmp_path: Path,
) -> None:
    """Closing the store while an fsync is in flight and another write waits for the next
    one, and the helper dies meanwhile: both writes hear that the store closed; none waits
    forever."""
    store = SQLiteStore(str(tmp_path / "g.db"))
    await store.open()
    first, second = await store.create(op(1)), await store.create(op(2))
    syncer = store._syncer
    assert isinstance(syncer, WalSyncer) and syncer.pid is not None
    pid = syncer.pid
    os.kill(pid, signal.SIGSTOP)
    in_flight = asyncio.ensure_future(store.save(first))
    while syncer._asked is None:
        await asyncio.sleep(0.001)
    waiting = asyncio.ensure_future(store.save(second))  # committed, waits for the next
    await asyncio.sleep(0.01)
    closing = asyncio.ensure_future(store.close())
    await asyncio.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    await asyncio.wait_for(closing, 5)
    for write in (in_flight, waiting):
        with pytest.raises(StoreError):
            await asyncio.wait_for(write, 5)


def test_a_syncer_moved_to_another_event_loop_starts_a_helper_there(tmp_path: Path) -> None:
    """The helper's answers are watched by the loop that started it: a sync asked under
    another loop (with nothing in flight) ends that helper and starts one whose answers
    this loop hears."""
    wal = tmp_path / "g.db-wal"
    wal.write_bytes(b"frames")
    syncer = WalSyncer(str(wal))

    async def once() -> int | None:
        await asyncio.wait_for(synced(syncer), 5)
        return syncer.pid

    first = asyncio.run(once())
    second = asyncio.run(once())
    assert first is not None and second not in (None, first)
    assert gone(first)
    asyncio.run(syncer.close())
    assert second is not None and gone(second)

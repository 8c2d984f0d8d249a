"""This replica's audit lines shipped to the store that keeps every replica's (SPEC 25,
"Audit across replicas"; PostgreSQL): the file stays the source of truth, the store's copy
follows it.

Job: tail the audit file from the line after the last one the store has (its chain's
``last_seq``) and ship what is there in batches, off the request path: writing a line only
sets an event. Never here: a write a request waits for, a line taken from anywhere but the
file. A store that fails (down, or a role without rights on ``audit_lines``) is tried again
with backoff while the gateway serves; the lines wait in the file meanwhile and are all
shipped, in order, once it answers (after a restart too: the chain's ``last_seq`` says
where to go on). A chain is a file: its id is the start of the hash of the file's first
line (with the replica's name), so the workers of ``serve --workers`` (one file) share one
chain, and a file that starts over is a new chain, shipped from its first line.

Rotation. The mirror reads through a descriptor it keeps open on the file it ships. A file
renamed away (logrotate's ``create`` or ``nocreate``) is read to its end through it, and
left for the file at the path only once that one has a complete line: the writers move on
to the path before their first line there (observe/audit.py), so by then the renamed file
is final and none of its lines is missed. A file truncated in place (``copytruncate``) is
noticed at the next batch (``same_file``) and shipped from its first line again; lines
written after the last batch and before the truncation are only in the copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from gateway import StoreError
from gateway.observe.audit import parse_line
from gateway.store.auditlines import AuditLines, ShippedLine

log = logging.getLogger("statusgate")
SHIP_GAP = 0.1  # seconds at least between two batches: lines written meanwhile go together
SHIP_LINES = 1000  # lines a batch at most
SHIP_BYTES = 1 << 20  # bytes of the file read for a batch at most
IDLE = 1.0  # seconds a quiet mirror waits before looking at the file anyway
RETRY_FIRST, RETRY_MOST = 1.0, 30.0  # seconds between attempts while the store fails
CLOSE_GRACE = 2.0  # seconds a shutdown gives the last lines to reach the store
CHAIN_DIGITS = 16
UNFINISHED = 1 << 62  # the seq offset_after takes an unfinished last line to have


def replica_name(configured: str | None) -> str:
    """``audit.replica`` when set, else the host name (a Kubernetes pod's name)."""
    return configured or socket.gethostname()


def chain_of(path: Path, replica: str) -> str | None:
    """The id of the file's chain: CHAIN_DIGITS hex digits of the SHA-256 of the replica's
    name and the file's first line's hash (two files whose first lines are alike, from
    two replicas, are two chains); None while the file has no complete line."""
    try:
        with path.open("rb") as handle:
            return _chain_in(handle, replica)
    except FileNotFoundError:
        return None


def _chain_in(handle: BinaryIO, replica: str) -> str | None:
    handle.seek(0)
    first = handle.readline()
    line = parse_line(first) if first.endswith(b"\n") else None
    digest = line.get("hash") if line is not None else None
    if not isinstance(digest, str):
        return None
    return hashlib.sha256(f"{replica}\n{digest}".encode()).hexdigest()[:CHAIN_DIGITS]


def offset_after(path: Path, seq: int) -> int:
    """Where the first line with a seq past ``seq`` starts (the file's end when there is
    none): a binary search over the file's lines, whose seqs only grow."""
    with path.open("rb") as handle:
        return _offset_in(handle, seq)


def _offset_in(handle: BinaryIO, seq: int) -> int:
    lo, hi = 0, handle.seek(0, 2)  # lines starting before lo are at most seq; at hi on, past
    while lo < hi:
        mid = (lo + hi) // 2
        start = _line_start(handle, mid)
        if start >= hi:
            break  # no line starts in [mid, hi): look at [lo, hi) one line at a time
        found, end = _seq_at(handle, start)
        if found is not None and found > seq:
            hi = start
        else:
            lo = end
    while lo < hi:
        found, end = _seq_at(handle, lo)
        if found is not None and found > seq:
            return lo
        lo = end
    return hi


def _line_start(handle: Any, offset: int) -> int:
    """The first line start at or after ``offset``."""
    if offset == 0:
        return 0
    handle.seek(offset - 1)
    handle.readline()
    return int(handle.tell())


def _seq_at(handle: Any, start: int) -> tuple[int | None, int]:
    """The seq of the line starting at ``start`` (None when it has none) and where it ends."""
    handle.seek(start)
    raw = handle.readline()
    if not raw.endswith(b"\n"):
        return UNFINISHED, start + len(raw)  # a line still being written: not shipped yet
    line = parse_line(raw)
    seq = line.get("seq") if line is not None else None
    return (seq if isinstance(seq, int) else None), start + len(raw)


def _read(handle: BinaryIO, offset: int) -> tuple[list[bytes], int]:
    """The complete lines from ``offset`` on (SHIP_LINES, about SHIP_BYTES at most; a line
    longer than that alone) and where the next read starts."""
    handle.seek(offset)
    data = handle.read(SHIP_BYTES)
    if b"\n" not in data:
        handle.seek(offset)
        data = handle.readline()  # a line longer than SHIP_BYTES, or the file's end
    lines = data.split(b"\n")[:-1][:SHIP_LINES]  # the part after the last newline waits
    return lines, offset + sum(len(line) + 1 for line in lines)


@dataclass(frozen=True, slots=True)
class Batch:
    """What one read of the file found: the lines from an offset on, made what the store
    keeps, and the file they were read from, to tell whether it is still the same one."""

    lines: list[ShippedLine]
    count: int  # lines read (some may not be audit lines)
    offset: int  # where the next read starts
    chain: str | None  # the chain of the file as read (its first line's)
    size: int  # its size when read
    succeeded: bool  # the path named another file with a complete line before the read


def read_batch(handle: BinaryIO, path: Path, offset: int, replica: str) -> Batch:
    """The complete lines from ``offset`` on in the open file, each made what the store
    keeps (on a thread: the loop never parses a batch), and whether the path named another
    file with a complete line first (looked at before the read: the file is then final,
    and read to its end)."""
    succeeded = _succeeded(handle, path, replica)
    size = os.fstat(handle.fileno()).st_size
    chain = _chain_in(handle, replica)
    raw, end = _read(handle, offset)
    lines = [line for line in map(shipped, raw) if line is not None]
    return Batch(lines, len(raw), end, chain, size, succeeded)


def _succeeded(handle: BinaryIO, path: Path, replica: str) -> bool:
    """Whether the path names a file other than the open one, with a complete line."""
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return False  # renamed away, no successor yet
    own = os.fstat(handle.fileno())
    if (now.st_dev, now.st_ino) == (own.st_dev, own.st_ino):
        return False
    return chain_of(path, replica) is not None


def same_file(batch: Batch, chain: str, offset: int) -> bool:
    """Whether ``batch`` is still the file the mirror has been shipping as ``chain``: not
    when it was truncated in place (smaller than where the mirror had read to; or, written
    past that again, another first line: logrotate's copytruncate)."""
    return batch.chain == chain and batch.size >= offset


def shipped(raw: bytes) -> ShippedLine | None:
    """A file line as the store keeps it; None for one that is not an audit line."""
    try:
        line = orjson.loads(raw)  # several times json's speed: a batch is 1,000 of them
    except orjson.JSONDecodeError:
        return None
    if not isinstance(line, dict) or not isinstance(line.get("seq"), int):
        return None
    operation_id = line.get("operation_id")
    return ShippedLine(
        seq=line["seq"],
        at=_instant(line.get("at")),
        operation_id=operation_id if isinstance(operation_id, str) else None,
        line=raw.decode(),
    )


def _instant(at: Any) -> float:
    try:
        return datetime.fromisoformat(str(at)).timestamp()
    except ValueError:
        return 0.0


class AuditMirror:
    """Ships one audit file's lines to ``lines``, in the background, as ``replica``."""

    def __init__(
        self,
        path: Path,
        lines: AuditLines,
        replica: str,
        *,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        self.path = path
        self.replica = replica
        self._lines = lines
        self._sleep = sleep
        self._wake = asyncio.Event()
        self._chain: str | None = None
        self._offset: int | None = None  # where the next line to ship starts
        self._file: BinaryIO | None = None  # the file shipped, open (renamed away, too)
        self._task: asyncio.Task[None] | None = None
        self._failing: str | None = None
        self.shipped = 0  # lines shipped by this process

    def nudge(self) -> None:
        """A line was written (AuditLog.on_written): ship it with the next batch."""
        self._wake.set()

    def start(self) -> None:
        """Ship in the background, first what an earlier run left in the file."""
        self._wake.set()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        retry = RETRY_FIRST
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(IDLE):  # other workers' lines wake no one here
                    await self._wake.wait()
            self._wake.clear()
            try:
                await self.ship_all()
            except (StoreError, OSError) as exc:
                self._failed(str(exc))
                await self._sleep(retry)
                retry = min(2 * retry, RETRY_MOST)
                continue
            except Exception:  # never die: the lines would wait for ever
                log.exception("audit mirror: shipping %s failed; trying again", self.path)
                await self._sleep(RETRY_MOST)
                continue
            retry = RETRY_FIRST
            await self._sleep(SHIP_GAP)

    async def ship_all(self) -> int:
        """Ship every complete line the store does not have yet; how many."""
        count = 0
        while True:
            batch = await self.ship_once()
            count += batch
            if batch == 0:
                break
        if self._failing is not None:
            log.warning("audit lines reach the store again (%s caught up)", self.path)
            self._failing = None
        return count

    async def ship_once(self, *, again: bool = True) -> int:
        """One batch: the lines after the last one shipped, up to SHIP_LINES; how many.
        A file renamed away is read to its end, then left for its successor at the path;
        one truncated in place starts over as a new chain (``same_file``); either is then
        shipped from its first line."""
        if self._file is None:
            try:
                self._file = await asyncio.to_thread(self.path.open, "rb")
            except FileNotFoundError:
                return 0  # not made yet
        if self._chain is None:
            self._chain = await asyncio.to_thread(_chain_in, self._file, self.replica)
            if self._chain is None:  # no complete line yet: the file stays open, so lines
                # written and renamed away before the next batch are still read from it;
                # it is left only once the path names a successor with a line (then final)
                if await asyncio.to_thread(_succeeded, self._file, self.path, self.replica):
                    return await self._next_file(again)
                return 0
        if self._offset is None:
            last = await self._lines.last_seq(self._chain)
            self._offset = await asyncio.to_thread(_offset_in, self._file, last or 0)
        batch = await asyncio.to_thread(
            read_batch, self._file, self.path, self._offset, self.replica
        )
        if not same_file(batch, self._chain, self._offset):
            log.info("audit file %s was truncated: shipping it as a new chain", self.path)
            return await self._next_file(again)
        if batch.lines:
            await self._lines.ship(self._chain, self.replica, batch.lines)
        self._offset = batch.offset
        self.shipped += len(batch.lines)
        if batch.count == 0 and batch.succeeded:
            log.info(
                "audit file %s was renamed away and shipped: shipping its successor", self.path
            )
            return await self._next_file(again)
        return batch.count

    async def _next_file(self, again: bool) -> int:
        self._start_over()
        return await self.ship_once(again=False) if again else 0

    def _start_over(self) -> None:
        """Forget the file shipped so far: the next batch opens the file now at the path
        and finds its chain, and where to go on in it, afresh."""
        if self._file is not None:
            self._file.close()
        self._file, self._chain, self._offset = None, None, None

    def _failed(self, problem: str) -> None:
        if self._failing is None:
            log.warning(
                "audit lines cannot reach the store (%s); they wait in %s, the gateway goes"
                " on serving, and they are shipped once the store takes them",
                problem,
                self.path,
            )
        self._failing = problem

    async def close(self) -> None:
        """Stop; first give the last lines CLOSE_GRACE seconds to reach the store (those
        that do not are shipped by the next start from the file)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task], timeout=CLOSE_GRACE)
            self._task = None
        with contextlib.suppress(StoreError, OSError, TimeoutError):
            async with asyncio.timeout(CLOSE_GRACE):
                await self.ship_all()
        self._start_over()

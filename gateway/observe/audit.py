"""The hash-chained audit log (SPEC section 8): pure chain and verify functions, and a writer.

One JSON object per line (its other members sorted, ``hash`` last); ``hash = SHA-256(prev +
canonical_json(line without hash))``, or HMAC-SHA256 with a key. ``prev`` of the first line
is 64 zeros. ``verify`` needs nothing but the file (and the key), so it runs offline. The
writer appends and never rewrites; a torn final line left by a crash is moved aside (to
``<file>.torn-<time>``) before appending.
Secrets never enter a line: callers pass only ids, states, numbers and fixed texts.

A line is written whole or not at all: a write the disk cut short is truncated back to the
line's start. A line the disk refused (full, over a size limit) is kept, in order, and
written before any other once space returns (``writable``, the gateway's gate: it takes no
new work while a line waits), so the chain never breaks and no line is lost while the
process lives.

Rotation: truncated in place (logrotate's ``copytruncate``), the file goes on from its start
with the next seq. Renamed away (logrotate's ``create`` or ``nocreate``), the writer notices
that the path names another file (or none) and goes on at the path (made if missing) with
the next seq and prev, as after a truncation: alone, when it next writes at least
``LOOK_SECONDS`` after it last looked (lines written meanwhile go on into the renamed file,
which they continue); shared (``serve --workers``), at every write, under the flock, after
reading the renamed file's final end, so every worker leaves it before the first line at
the path and the workers' lines stay one chain. Either way the first line of a file past
seq 1 is marked ``"rotated": true``, and ``verify_file`` verifies such a file from there
(any other from seq 1).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import fcntl
import hashlib
import hmac
import json
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import orjson

log = logging.getLogger("statusgate")
GENESIS = "0" * 64
FIELDS = (
    "seq",
    "at",
    "operation_id",
    "provider",
    "account",
    "event",
    "provider_state",
    "http_status",
    "decision",
    "next_poll_at",
    "delay_source",
    "requests_used",
    "max_requests",
    "deadline_at",
    "reason",
    "detail",
    "actor",
)


class Fsync(enum.StrEnum):
    ALWAYS = "always"  # fsync every line before the agent gets its answer
    BATCH = "batch"  # fsync in the background at most every BATCH_SECONDS
    NEVER = "never"  # leave it to the operating system


BATCH_SECONDS = 0.2
TAIL_BYTES = 1 << 20  # read back in blocks of this size, whatever a line's length
MIN_FREE = 64 << 10  # below this much free space the gateway takes no new work
LOOK_SECONDS = 1.0  # a lone writer compares its file with the path at most this often


def canonical_json(data: dict[str, Any]) -> bytes:
    """Sorted keys, no spaces, UTF-8: ``json.dumps(sort_keys=True, separators=(",", ":"),
    ensure_ascii=False)``. A flat line of strings, integers, booleans, nulls and floats
    written without an exponent (every line the gateway writes) goes through orjson, which
    writes those byte for byte the same (tests/observe/test_audit.py checks it) five times
    faster; anything else (a float json writes as ``1e-05``, which orjson spells otherwise)
    through json, so the chain never depends on which one ran."""
    if all(_exact(value) for value in data.values()):
        with contextlib.suppress(orjson.JSONEncodeError):  # an integer past 64 bits
            return orjson.dumps(data, option=orjson.OPT_SORT_KEYS)
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _exact(value: Any) -> bool:
    kind = type(value)
    if kind in _ORJSON_EXACT:
        return True
    if kind is float:
        size = abs(float(value))
        return size == 0 or 1e-4 <= size < 1e16  # repr without an exponent
    # a str enum (the ``event`` of every line): both write its string, byte for byte
    return isinstance(value, str)


_ORJSON_EXACT = frozenset({str, int, bool, type(None)})


def chain_hash(prev: str, line: dict[str, Any], key: bytes | None) -> str:
    """The hash of ``line`` (without its ``hash`` member) chained onto ``prev``."""
    return _digest(prev, canonical_json(line), key)


def _digest(prev: str, canonical: bytes, key: bytes | None) -> str:
    message = prev.encode() + canonical
    if key is not None:
        return hmac.new(key, message, hashlib.sha256).hexdigest()
    return hashlib.sha256(message).hexdigest()


@dataclass(frozen=True, slots=True)
class Verdict:
    records: int
    bad_seq: int | None = None  # first sequence number that breaks the chain
    problem: str | None = None
    torn_tail: bool = False  # the last line is an interrupted write, not part of the chain
    start: int = 1  # the seq the run starts at (past 1: a file after a rotation, or purged)
    start_prev: str = GENESIS  # the prev of its first line
    end_hash: str = GENESIS  # the hash of its last line

    @property
    def intact(self) -> bool:
        return self.problem is None


def verify(raw_lines: Iterable[bytes], key: bytes | None, *, anchored: bool = False) -> Verdict:
    """Recompute the chain; report the first sequence number that does not fit.

    ``anchored``: the lines are a run of a chain whose start is elsewhere (a database copy
    whose oldest lines were purged), so the first line's own ``seq`` and ``prev`` are where
    the run starts; from there every line must follow as in a whole file."""
    lines = list(raw_lines)
    prev, expected, count = GENESIS, 1, 0
    start, start_prev = expected, prev
    for index, raw in enumerate(lines):
        last = index == len(lines) - 1
        line = parse_line(raw)
        if line is None:
            if last and not raw.endswith(b"\n"):
                return Verdict(count, None, None, True, start, start_prev, prev)
            return Verdict(count, expected, f"line {index + 1} is not a JSON object")
        if anchored and index == 0 and isinstance(line.get("seq"), int):
            prev, expected = str(line.get("prev")), int(line["seq"])
            start, start_prev = expected, prev
        problem = link_problem(line, prev, expected, key)
        if problem is not None:
            return Verdict(count, expected, problem)
        prev, expected, count = str(line["hash"]), expected + 1, count + 1
    return Verdict(count, None, None, False, start, start_prev, prev)


def verify_file(path: Path, key: bytes | None) -> Verdict:
    """A file's chain. A file whose first line is marked ``"rotated": true`` (the writer
    marks the line it writes into an empty file past seq 1: logrotate moved the lines
    before it to another file) is verified from that line, as a database copy whose oldest
    lines were purged is: its ``start`` says where the run starts; that it continues the
    file before it is checked when both are verified together (``continues``). Any other
    file starts at seq 1 from the genesis prev, so lines cut from a file's start are found
    (the mark is under the hash: with a key, only the writer can make it)."""
    lines = list(read_lines(path))
    first = parse_line(lines[0]) if lines else None
    rotated = first is not None and first.get("rotated") is True
    return verify(lines, key, anchored=rotated)


def continues(later: Verdict, earlier: Verdict) -> bool | None:
    """Whether the run ``later`` takes up where ``earlier`` ends (its first line's prev is
    the hash of ``earlier``'s last, one seq on); None when ``earlier`` does not end just
    before ``later`` starts (another file's lines, or none)."""
    if later.start == 1 or earlier.start + earlier.records != later.start:
        return None
    return earlier.records > 0 and later.start_prev == earlier.end_hash


def parse_line(raw: bytes | str) -> dict[str, Any] | None:
    try:
        line = json.loads(raw)
    except ValueError:
        return None
    return line if isinstance(line, dict) else None


def link_problem(line: dict[str, Any], prev: str, expected: int, key: bytes | None) -> str | None:
    """Why ``line`` is not the link with seq ``expected`` after the hash ``prev``, or None."""
    seq = line.get("seq")
    if seq != expected:
        return f"expected seq {expected}, found {seq!r}"
    body = {name: value for name, value in line.items() if name != "hash"}
    if line.get("prev") != prev or line.get("hash") != chain_hash(prev, body, key):
        return "hash does not match (altered, or another key)"
    return None


def read_lines(path: Path) -> Iterator[bytes]:
    with path.open("rb") as handle:
        yield from handle


def records(path: Path) -> Iterator[dict[str, Any]]:
    """Every complete line of an audit file, in order; a torn tail is skipped."""
    for raw in read_lines(path):
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        if isinstance(line, dict):
            yield line


def last_line(handle: BinaryIO, end: int) -> tuple[int, bytes]:
    """Where the last line of the file's first ``end`` bytes starts, and the line (with its
    newline when it has one). Read backwards in TAIL_BYTES blocks, so a line of any length
    (one an older version wrote, however long) is found whole."""
    stop = end
    if end:
        handle.seek(end - 1)
        if handle.read(1) == b"\n":
            stop = end - 1  # the line's own newline is not the one before it
    start = stop
    while start > 0:
        step = min(TAIL_BYTES, start)
        handle.seek(start - step)
        cut = handle.read(step).rfind(b"\n")
        if cut >= 0:
            start = start - step + cut + 1
            break
        start -= step
    handle.seek(start)
    return start, handle.read(end - start)


def _fsync_and_close(fd: int) -> None:
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class AuditLog:
    """Appends sealed lines to one file; ``append`` returns once the line is written (or,
    refused by the disk, kept to be written first when ``writable`` finds space again)."""

    def __init__(
        self,
        path: Path,
        *,
        key: bytes | None,
        fsync: Fsync = Fsync.BATCH,
        shared: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self._where = os.fspath(path)  # stat's argument, converted once
        self._clock = clock
        self._look_at = 0.0  # when a lone writer next compares its file with the path
        self._key = key
        self._fsync = fsync
        self._file: Any = None
        self._seq = 0
        self._prev = GENESIS
        self._dirty = False
        self._room_seen = False  # this turn of the loop saw room on the disk
        self._flusher: asyncio.Task[None] | None = None
        # Several processes (serve --workers) append to one chain: each append then holds
        # an exclusive flock and first reads the chain's end another process may have moved.
        self._shared = shared
        self._size = 0
        self._waiting: deque[dict[str, Any]] = deque()  # refused by the disk, in order
        self._refusing = False  # logged once per spell of refusals
        self._unsynced = False  # an fsync failed: not writable until one succeeds
        self.on_written: Callable[[], None] | None = None  # told after lines are written
        self._stranded = False  # renamed away, and the path could not be opened (logged)

    def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.touch(exist_ok=True)
        with self.path.open("rb+") as handle:
            if self._shared:  # another worker may be appending: look at the end alone
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            size = handle.seek(0, os.SEEK_END)
            start, last = last_line(handle, size)
            if last and not last.endswith(b"\n"):  # a crash interrupted the last write
                aside = self.path.with_name(f"{self.path.name}.torn-{int(time.time())}")
                aside.write_bytes(last)
                handle.truncate(start)
                _, last = last_line(handle, start)
        self._follow(last)
        self._file = self.path.open("a+b", buffering=0)  # read too: the end after a rename
        self._size = os.fstat(self._file.fileno()).st_size
        self._look_at = self._clock() + LOOK_SECONDS

    def _follow(self, last: bytes) -> None:
        """Continue the chain from its last complete line (none: from the start)."""
        if last.strip():
            line = json.loads(last)
            self._seq, self._prev = int(line["seq"]), str(line["hash"])

    def _catch_up(self, size: int) -> None:
        """Under the flock: if another process appended since our last write, read the
        chain's new end (its last line), through our own descriptor (the path may name
        another file by now)."""
        if size != self._size:
            with os.fdopen(os.dup(self._file.fileno()), "rb") as handle:
                self._follow(last_line(handle, size)[1])
            self._size = size

    def _renamed(self, own: os.stat_result) -> bool:
        """Whether the path no longer names the open file (renamed away, or removed)."""
        try:
            now = os.stat(self._where)
        except FileNotFoundError:
            return True
        return (now.st_ino, now.st_dev) != (own.st_ino, own.st_dev)

    def _reopen(self) -> bool:
        """Leave the renamed file (synced first, unless fsync is ``never``) for the file at
        the path, made if missing; the chain goes on from where it is. False, logged (once
        until it can), when the path cannot be opened: the lines go on into the renamed
        file meanwhile."""
        try:
            opened = self.path.open("a+b", buffering=0)
        except OSError as exc:
            if self._stranded:
                return False
            self._stranded = True
            log.error(
                "audit log %s was renamed away and cannot be made again (%s): its lines go"
                " on into the renamed file",
                self.path,
                exc.strerror or exc,
            )
            return False
        if self._fsync is not Fsync.NEVER:
            self._sync()
        self._file.close()
        self._file, self._stranded = opened, False
        self._size = 0  # shared: any line there is another worker's, and read as the end
        log.info("audit log %s was renamed away: going on in a file at its path", self.path)
        return True

    def _lock(self) -> None:
        """Shared: hold the flock on the file the path names, the chain's end read from it.
        A renamed file's end is final once its flock is held and the rename seen (every
        writer looks under it before writing), so the chain goes on from there."""
        while True:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX)
            own = os.fstat(self._file.fileno())
            self._catch_up(own.st_size)
            if not self._renamed(own):
                return
            if not self._reopen():  # else the renamed file closed, its flock with it
                return  # still under the renamed file's flock: written there

    def follow(self) -> None:
        """Follow a rename to the path now, with nothing to write (the sweeper, once a
        second). Shared (``serve --workers``), a worker that writes nothing for a while
        would otherwise, at its next line, read the chain's end from the file it had
        open, which after two rotations is not the end: it would write a seq twice."""
        if self._file is None:
            return
        if self._shared:
            self._lock()
            fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
        else:
            self._look()

    def _look(self) -> None:
        """Alone, LOOK_SECONDS after the last look: follow a rename to the path."""
        self._look_at = self._clock() + LOOK_SECONDS
        if self._renamed(os.fstat(self._file.fileno())):
            self._reopen()

    @property
    def waiting(self) -> int:
        """Lines the disk refused, not yet written (0 when the log is healthy)."""
        return len(self._waiting)

    def writable(self) -> bool:
        """The gate before new work: every line so far is on file (else one attempt to
        write the lines the disk refused, in order) and the disk has ``MIN_FREE`` bytes
        left, so new work is refused before its side effects rather than its line after
        them. One ``fstatvfs`` when healthy."""
        if self._waiting and self._write_waiting() is not None and self._fsync is not Fsync.NEVER:
            self._unsynced = True  # lines written late are on disk before new work
        if self._unsynced:
            self._sync()
        if self._waiting or self._unsynced:
            return False
        if self._file is not None and not self._room_seen:
            stats = os.fstatvfs(self._file.fileno())
            if stats.f_bavail * stats.f_frsize < MIN_FREE:
                self._refused(f"less than {MIN_FREE} bytes free on its disk")
                return False
            self._seen_room()
        self._recovered(0)
        return True

    def _seen_room(self) -> None:
        """Room on the disk, as seen by the ``fstatvfs`` just made: the requests of the same
        turn of the event loop share that look (it measured ~8 us, a tenth of a refusal);
        the next turn looks again. Off the loop every call looks."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._room_seen = True
        loop.call_soon(self._forget_room)

    def _forget_room(self) -> None:
        self._room_seen = False

    def _sync(self) -> None:
        """fsync; a failure (ENOSPC or EIO where the disk only says so then) closes the
        gate like a refused line until an fsync succeeds."""
        try:
            os.fsync(self._file.fileno())
        except OSError as exc:
            self._sync_failed(exc)
        else:
            self._unsynced = False

    async def _sync_off_loop(self) -> None:
        """``_sync`` with the fsync itself on a thread, through a descriptor of its own that
        the thread closes: a rename followed meanwhile (``_reopen``) closes the file's."""
        try:
            fd = os.dup(self._file.fileno())
            await asyncio.get_running_loop().run_in_executor(None, _fsync_and_close, fd)
        except OSError as exc:
            self._sync_failed(exc)
        else:
            self._unsynced = False

    def _sync_failed(self, exc: OSError) -> None:
        self._unsynced = True
        self._refused(f"fsync failed: {exc.strerror or exc}")

    def _refused(self, problem: str) -> None:
        if not self._refusing:
            self._refusing = True
            log.error(
                "audit log %s cannot be written (%s): the gateway takes no new work until it can",
                self.path,
                problem,
            )

    def _recovered(self, written: int) -> None:
        if self._refusing:
            self._refusing = False
            log.warning(
                "audit log %s is writable again; %d waiting lines written", self.path, written
            )

    async def append(self, fields: dict[str, Any]) -> dict[str, Any] | None:
        """Seal and write one line (no await between seq and write, so lines never
        interleave); with fsync ``always`` also wait until it is on disk. None when the
        disk refused it (or a line before it): it waits, in order, for ``writable``."""
        if self._file is None:
            self.open()
        self._waiting.append(dict(fields))
        line = self._write_waiting()
        if line is None:
            return None
        if self._fsync is Fsync.ALWAYS:
            await self._sync_off_loop()
        elif self._fsync is Fsync.BATCH:
            self._dirty = True
            if self._flusher is None or self._flusher.done():
                self._flusher = asyncio.create_task(self._flush_soon())
        return line

    def _write_waiting(self) -> dict[str, Any] | None:
        """Write waiting lines in order, each whole or not at all, until one is refused;
        the last line written when all were, else None."""
        written, line = 0, None
        if self._shared:
            self._lock()
        elif self._clock() >= self._look_at:  # a clock read a write: no system call
            self._look()
        try:
            while self._waiting:
                line = self._write_whole(self._waiting[0])
                if line is None:
                    break
                self._waiting.popleft()
                written += 1
        finally:
            if self._shared:
                fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
        if written and not self._waiting:
            self._recovered(written)
        if written and self.on_written is not None:
            self.on_written()
        return None if self._waiting else line

    def _write_whole(self, fields: dict[str, Any]) -> dict[str, Any] | None:
        """One line, whole or not at all: ``write`` may write less than asked on a nearly
        full disk, and what it wrote is then cut off again. None when it was refused."""
        fd = self._file.fileno()
        # shared, the flock's holder knows the size (_lock read it); alone, the file may
        # have been truncated since (copytruncate)
        start = self._size if self._shared else os.fstat(fd).st_size
        line = {**fields, "seq": self._seq + 1, "prev": self._prev}
        if not start and self._seq:  # a file's first line, not the chain's: after a rotation
            line["rotated"] = True
        canonical = canonical_json(line)  # serialised once: hashed, then written with
        line["hash"] = _digest(self._prev, canonical, self._key)  # the hash put last
        data = b'%s,"hash":"%s"}\n' % (canonical[:-1], line["hash"].encode())
        try:
            count = self._file.write(data)
            problem = None if count == len(data) else f"only {count} of {len(data)} bytes written"
        except OSError as exc:
            count, problem = 0, exc.strerror or str(exc)
        if problem is not None:
            if count:
                os.ftruncate(fd, start)  # the line's start: the file ends on a whole line
            self._refused(problem)
            return None
        self._seq, self._prev = line["seq"], line["hash"]
        self._size = start + len(data)
        return line

    async def _flush_soon(self) -> None:
        await asyncio.sleep(BATCH_SECONDS)
        if self._dirty and self._file is not None:
            self._dirty = False
            await self._sync_off_loop()

    async def close(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
        if self._file is not None:
            if not self.writable() and self._waiting:
                log.error(
                    "audit log %s: %d lines the disk refused are lost at shutdown",
                    self.path,
                    len(self._waiting),
                )
            self._sync()
            self._file.close()
            self._file = None

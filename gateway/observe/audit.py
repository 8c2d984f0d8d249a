"""The hash-chained audit log (SPEC section 8): pure chain and verify functions, and a writer.

One JSON object per line; ``hash = SHA-256(prev + canonical_json(line without hash))``, or
HMAC-SHA256 with a key. ``prev`` of the first line is 64 zeros. ``verify`` needs nothing but
the file (and the key), so it runs offline. The writer appends and never rewrites; a torn
final line left by a crash is moved aside (to ``<file>.torn-<time>``) before appending.
Secrets never enter a line: callers pass only ids, states, numbers and fixed texts.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import fcntl
import hashlib
import hmac
import json
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

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
TAIL_BYTES = 1 << 20  # longer than any line the gateway writes


def canonical_json(data: dict[str, Any]) -> bytes:
    """Sorted keys, no spaces, UTF-8: ``json.dumps(sort_keys=True, separators=(",", ":"),
    ensure_ascii=False)``. A flat line of strings, integers, booleans and nulls (every line
    the gateway writes) goes through orjson, which writes those byte for byte the same
    (tests/test_audit.py checks it) five times faster; anything else (a float, which the two
    format differently) through json, so the chain never depends on which one ran."""
    if all(type(value) in _ORJSON_EXACT for value in data.values()):
        with contextlib.suppress(orjson.JSONEncodeError):  # an integer past 64 bits
            return orjson.dumps(data, option=orjson.OPT_SORT_KEYS)
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


_ORJSON_EXACT = frozenset({str, int, bool, type(None)})


def chain_hash(prev: str, line: dict[str, Any], key: bytes | None) -> str:
    """The hash of ``line`` (without its ``hash`` member) chained onto ``prev``."""
    message = prev.encode() + canonical_json(line)
    if key is not None:
        return hmac.new(key, message, hashlib.sha256).hexdigest()
    return hashlib.sha256(message).hexdigest()


def seal(fields: dict[str, Any], seq: int, prev: str, key: bytes | None) -> dict[str, Any]:
    """A complete line: ``fields`` plus seq, prev and hash."""
    line = {**fields, "seq": seq, "prev": prev}
    line["hash"] = chain_hash(prev, line, key)
    return line


@dataclass(frozen=True, slots=True)
class Verdict:
    records: int
    bad_seq: int | None = None  # first sequence number that breaks the chain
    problem: str | None = None
    torn_tail: bool = False  # the last line is an interrupted write, not part of the chain

    @property
    def intact(self) -> bool:
        return self.problem is None


def verify(raw_lines: Iterable[bytes], key: bytes | None) -> Verdict:
    """Recompute the chain; report the first sequence number that does not fit."""
    lines = list(raw_lines)
    prev, expected, count = GENESIS, 1, 0
    for index, raw in enumerate(lines):
        last = index == len(lines) - 1
        try:
            line = json.loads(raw)
            if not isinstance(line, dict):
                raise ValueError("not an object")
        except ValueError:
            if last and not raw.endswith(b"\n"):
                return Verdict(count, torn_tail=True)
            return Verdict(count, expected, f"line {index + 1} is not a JSON object")
        seq = line.get("seq")
        if seq != expected:
            return Verdict(count, expected, f"expected seq {expected}, found {seq!r}")
        claimed = line.pop("hash", None)
        if line.get("prev") != prev or claimed != chain_hash(prev, line, key):
            return Verdict(count, expected, "hash does not match (altered, or another key)")
        prev, expected, count = claimed, expected + 1, count + 1
    return Verdict(count)


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


class AuditLog:
    """Appends sealed lines to one file; ``append`` returns once the line is written."""

    def __init__(
        self, path: Path, *, key: bytes | None, fsync: Fsync = Fsync.BATCH, shared: bool = False
    ) -> None:
        self.path = path
        self._key = key
        self._fsync = fsync
        self._file: Any = None
        self._seq = 0
        self._prev = GENESIS
        self._dirty = False
        self._flusher: asyncio.Task[None] | None = None
        # Several processes (serve --workers) append to one chain: each append then holds
        # an exclusive flock and first reads the chain's end another process may have moved.
        self._shared = shared
        self._size = 0

    def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.touch(exist_ok=True)
        with self.path.open("rb+") as handle:
            if self._shared:  # another worker may be appending: look at the end alone
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            size = handle.seek(0, os.SEEK_END)
            start = max(0, size - TAIL_BYTES)
            handle.seek(start)
            tail = handle.read()
            if tail and not tail.endswith(b"\n"):  # a crash interrupted the last write
                cut = tail.rfind(b"\n") + 1
                aside = self.path.with_name(f"{self.path.name}.torn-{int(time.time())}")
                aside.write_bytes(tail[cut:])
                handle.truncate(start + cut)
                tail = tail[:cut]
        self._follow(tail)
        self._file = self.path.open("ab", buffering=0)
        self._size = self.path.stat().st_size

    def _follow(self, tail: bytes) -> None:
        """Continue the chain from the last complete line of ``tail``."""
        complete = tail.splitlines()
        if complete:
            last = json.loads(complete[-1])
            self._seq, self._prev = int(last["seq"]), str(last["hash"])

    def _catch_up(self) -> None:
        """Under the flock: if another process appended since our last write, read the
        chain's new end (its last line)."""
        size = os.fstat(self._file.fileno()).st_size
        if size != self._size:
            with self.path.open("rb") as handle:
                handle.seek(max(0, size - TAIL_BYTES))
                self._follow(handle.read(size - handle.tell()))

    async def append(self, fields: dict[str, Any]) -> dict[str, Any]:
        """Seal and write one line (no await between seq and write, so lines never
        interleave); with fsync ``always`` also wait until it is on disk."""
        if self._file is None:
            self.open()
        if self._shared:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX)
        try:
            if self._shared:
                self._catch_up()
            line = seal(fields, self._seq + 1, self._prev, self._key)
            data = canonical_json(line) + b"\n"
            self._file.write(data)
            self._size = os.fstat(self._file.fileno()).st_size if self._shared else 0
        finally:
            if self._shared:
                fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
        self._seq, self._prev = line["seq"], line["hash"]
        if self._fsync is Fsync.ALWAYS:
            await asyncio.get_running_loop().run_in_executor(None, os.fsync, self._file.fileno())
        elif self._fsync is Fsync.BATCH:
            self._dirty = True
            if self._flusher is None or self._flusher.done():
                self._flusher = asyncio.create_task(self._flush_soon())
        return line

    async def _flush_soon(self) -> None:
        await asyncio.sleep(BATCH_SECONDS)
        if self._dirty and self._file is not None:
            self._dirty = False
            await asyncio.get_running_loop().run_in_executor(None, os.fsync, self._file.fileno())

    async def close(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
        if self._file is not None:
            os.fsync(self._file.fileno())
            self._file.close()
            self._file = None

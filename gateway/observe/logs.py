"""Logging (SPEC 13): JSON lines on stderr by default (python-json-logger), plain text on
request, one level switch; one line per request.

Never logs a query string, a token or a credential: the request line carries the path
without its query, the account id, never a header value.
"""

from __future__ import annotations

import asyncio
import logging
import logging.handlers
import os
import threading
import time
from queue import Empty, SimpleQueue
from typing import Any

import orjson
from pythonjsonlogger.json import JsonFormatter

from gateway.settings.config import LoggingSettings

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}
LEVELS["error"] = logging.ERROR
REQUEST_FIELDS = (
    "request_id",
    "method",
    "path",
    "status",
    "duration_ms",
    "account",
    "provider",
    "operation_id",
    "outcome",
    "provider_status",
    "provider_ms",
)
requests_log = logging.getLogger("statusgate.request")


class _Json(JsonFormatter):
    """``ts`` (RFC 3339 UTC, milliseconds), ``level``, ``event``, then the record's extras."""

    def add_fields(
        self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        log_data["ts"] = _stamp(record.created)
        log_data["level"] = record.levelname.lower()
        log_data["event"] = record.getMessage()
        super().add_fields(log_data, record, message_dict)
        log_data.pop("message", None)
        if record.name != "statusgate.request":
            log_data.setdefault("logger", record.name)


class _Text(logging.Formatter):
    """``ts level event key=value ...`` for people reading a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_stamp(record.created)} {record.levelname.lower()} {record.getMessage()}"
        extras = [(k, getattr(record, k)) for k in REQUEST_FIELDS if hasattr(record, k)]
        line += "".join(f" {k}={_safe(v)}" for k, v in extras if v is not None)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def _safe(value: object) -> str:
    """A value on one text line: control characters (a %0A in a path) cannot forge lines."""
    text = str(value)
    return text if text.isprintable() else repr(text)


def _stamp(created: float) -> str:
    """RFC 3339 with milliseconds; the seconds part formatted once a second."""
    whole = int(created)
    second, text = _second
    if whole != second:
        text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
        _second[:] = (whole, text)
    return f"{text}.{int(created * 1000) % 1000:03d}Z"


_second: list[Any] = [-1, ""]  # the last second formatted, and its text


class _Stderr(logging.Handler):
    """Writes formatted records straight to file descriptor 2. Not through sys.stderr, and
    without a handler lock: a write blocked on an unread pipe then holds no lock that
    interpreter exit would wait for, so a gateway whose stderr nobody reads still stops."""

    def createLock(self) -> None:
        """No lock: only the writer thread emits, and logging's exit-time shutdown must
        not wait for a write that an unread pipe keeps blocked."""
        self.lock = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            _write((self.format(record) + "\n").encode("utf-8", "replace"))
        except Exception:
            self.handleError(record)


def _write(data: bytes) -> None:
    while data:
        data = data[os.write(2, data) :]


class _Dropping(logging.handlers.QueueHandler):
    """Hands records to the writer thread; when it is far behind (stderr not read), drops
    them instead of blocking the event loop, and says how many once it catches up."""

    def __init__(self, queue: SimpleQueue[logging.LogRecord | bytes | None]) -> None:
        super().__init__(queue)
        self._queue = queue
        self.dropped = 0

    def enqueue(self, record: logging.LogRecord) -> None:
        if self._queue.qsize() >= QUEUE_SIZE:
            self.dropped += 1
        else:
            self._queue.put_nowait(record)


class _Writer:
    """One daemon thread writing log records to stderr, off the event loop."""

    def __init__(self, handler: logging.Handler, json_lines: bool) -> None:
        # SimpleQueue: a C queue, measured cheaper per line than Queue; bounded by hand
        self.queue: SimpleQueue[logging.LogRecord | bytes | None] = SimpleQueue()
        self.front = _Dropping(self.queue)
        self.json_lines = json_lines
        self._turn: list[bytes] | None = None  # rendered lines of this turn of the loop
        self._turn_loop: asyncio.AbstractEventLoop | None = None  # ... of this loop
        self._known_loop: tuple[int, asyncio.AbstractEventLoop] | None = None
        self._handler = handler
        self._thread = threading.Thread(target=self._run, name="statusgate-log", daemon=True)
        self._thread.start()

    def line(self, data: bytes) -> None:
        """A line already rendered (the request lines: the hot path skips LogRecords).
        On the event loop, the lines of one turn of the loop go to the thread together at
        the next turn's start: one hand-off (one wake-up of the thread, one contest for
        the GIL) per turn instead of per request."""
        loop = self._running_loop()
        if self._turn is not None:
            if loop is self._turn_loop:
                self._turn.append(data)
                return
            self._hand_over()  # a loop that ended before its turn's hand-off ran
        if loop is None:
            self._put(data, 1)
            return
        self._turn, self._turn_loop = [data], loop
        loop.call_soon(self._hand_over)

    def _running_loop(self) -> asyncio.AbstractEventLoop | None:
        """This thread's running loop, remembered: ``asyncio.get_running_loop`` makes a
        getpid system call each time (its fork check), measured ~10% of a refusal. A loop
        remembered for this thread that is running is the one running here (a thread runs
        one loop at a time)."""
        thread = threading.get_ident()
        known = self._known_loop
        if known is not None and known[0] == thread and known[1].is_running():
            return known[1]
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return None
        self._known_loop = (thread, loop)
        return loop

    def _hand_over(self) -> None:
        lines, self._turn = self._turn or [], None
        self._put(b"".join(lines), len(lines))

    def _put(self, data: bytes, lines: int) -> None:
        if self.queue.qsize() >= QUEUE_SIZE:
            self.front.dropped += lines
        else:
            self.queue.put_nowait(data)

    def _next(self) -> logging.LogRecord | bytes | None:
        """The next queued record. The thread looks every IDLE_WAIT when the queue is empty
        instead of blocking on it, so handing a record over never has to wake it (a
        wake-up per hand-off measured ~3% of a forwarded poll's event-loop time)."""
        while True:
            try:
                return self.queue.get_nowait()
            except Empty:
                time.sleep(IDLE_WAIT)

    def _run(self) -> None:
        while (record := self._next()) is not None:
            if isinstance(record, bytes):
                written = self._lines(record)
                if written is None:
                    return
                if written < LINES_PER_WRITE:  # a short batch: let the next one gather
                    time.sleep(IDLE_WAIT)
            else:
                self._handler.handle(record)
            if self.front.dropped and self.queue.empty():
                dropped, self.front.dropped = self.front.dropped, 0
                note = f"dropped {dropped} log records: stderr was not read fast enough"
                self._handler.handle(
                    logging.LogRecord("statusgate", logging.WARNING, __file__, 0, note, None, None)
                )

    def _lines(self, first: bytes) -> int | None:
        """Write ``first`` and every rendered line already waiting behind it in one write
        (one system call for a burst); a record met meanwhile is handled in turn. How many
        hand-offs were written; None when the stop marker was met. After a short batch the
        thread sleeps IDLE_WAIT before looking again, so under load it takes the GIL about
        fifty times a second, not once per turn of the event loop (measured: ~10% of a
        too-early refusal's throughput went to the contest for the GIL)."""
        lines = [first]
        while len(lines) < LINES_PER_WRITE:
            try:
                nxt = self.queue.get_nowait()
            except Empty:
                break
            if isinstance(nxt, bytes):
                lines.append(nxt)
                continue
            _write(b"".join(lines))
            if nxt is None:
                return None
            self._handler.handle(nxt)
            return len(lines)
        _write(b"".join(lines))
        return len(lines)

    def stop(self) -> None:
        """Write what is queued (for at most a second: a stalled stderr cannot hang exit)."""
        if self._turn is not None:
            self._hand_over()
        self.queue.put(None)
        self._thread.join(timeout=1.0)


QUEUE_SIZE = 10_000
IDLE_WAIT = 0.02  # seconds the writer thread sleeps when nothing is queued
LINES_PER_WRITE = 256
_writer: _Writer | None = None


def configure(settings: LoggingSettings) -> None:
    """Send every log record to stderr in the configured format and level (again on reload).

    Records are formatted and written by a thread of their own, so a slow or unread stderr
    never stalls request handling; past QUEUE_SIZE waiting records, new ones are dropped."""
    global _writer
    handler = _Stderr()
    handler.setFormatter(_Json() if settings.format == "json" else _Text())
    stop()
    _writer = _Writer(handler, settings.format == "json")
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(_writer.front)
    root.setLevel(LEVELS[settings.level])
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def stop() -> None:
    """Flush and stop the writer thread (at exit, or before a reconfiguration)."""
    global _writer
    if _writer is not None:
        logging.getLogger().removeHandler(_writer.front)
        _writer.stop()
        _writer = None


def request_line(fields: dict[str, Any]) -> None:
    """The one line a request gives (SPEC 13): ``fields`` holds every name of
    REQUEST_FIELDS, in that order (None where absent).

    On the hot path: rendered here with orjson, in the same shape the JSON formatter gives,
    and handed to the writer thread as bytes (no LogRecord, no formatter)."""
    if not requests_log.isEnabledFor(logging.INFO):
        return
    writer = _writer
    if writer is None or not writer.json_lines:
        requests_log.info("request", extra=fields)
        return
    line = {"ts": _stamp(time.time()), "level": "info", "event": "request"}
    line.update(fields)
    writer.line(orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE))


def say(settings: LoggingSettings, level: int, event: str, **fields: Any) -> None:
    """One line on stderr at once, in the configured format, without the writer thread: for
    the lines of a process that has not started logging (or has stopped it), such as the
    ``--workers`` supervisor or a listener that cannot bind."""
    if level < LEVELS[settings.level]:
        return
    record = logging.LogRecord("statusgate", level, __file__, 0, event, None, None)
    record.__dict__.update(fields)
    formatter = _Json() if settings.format == "json" else _Text()
    text = formatter.format(record)
    if settings.format == "text":
        text += "".join(f" {k}={_safe(v)}" for k, v in fields.items() if v is not None)
    _write((text + "\n").encode("utf-8", "replace"))

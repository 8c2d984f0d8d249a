"""The result route answered from a kept copy (SPEC 23): ``Statusgate-Result: kept``, the
copy's content type and length, no provider call. The copy is streamed chunk by chunk on
both listeners (a ``Streamed`` answer, gateway/http/lane/stream.py), never read whole;
MCP's ``get_result`` reads it whole (``read_copy``), its answer being one JSON message. A
copy that cannot be read (deleted under the gateway, the store down) answers nothing here:
the route then forwards as before."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from aiohttp import web

from gateway.core.models import KeptResult, OperationRecord
from gateway.flow.runtime import OUTCOME, Runtime
from gateway.http.answers import Call, operation_headers
from gateway.http.lane import Streamed
from gateway.http.lane.stream import Prepended, close
from gateway.store.results import ResultStoreError

log = logging.getLogger("statusgate")
KEPT_HEADER = "Statusgate-Result"


async def from_copy(
    call: Call, record: OperationRecord, kept: KeptResult
) -> web.StreamResponse | None:
    """The answer from ``kept``, or None when the copy cannot be read."""
    runtime = call.runtime
    chunks = await opened(runtime, record, kept)
    if chunks is None:
        return None
    headers = operation_headers(record, runtime.clock())
    headers[KEPT_HEADER] = "kept"
    headers["Content-Type"] = kept.content_type or "application/octet-stream"
    call.request[OUTCOME] = "cached"
    return Streamed(chunks, headers=headers, length=kept.size)


async def read_copy(runtime: Runtime, record: OperationRecord, kept: KeptResult) -> bytes | None:
    """The whole of ``kept`` (at most the policy's ``results.max_bytes``), or None when the
    copy cannot be read, or fails part way."""
    chunks = await opened(runtime, record, kept)
    if chunks is None:
        return None
    body = bytearray()
    try:
        async for chunk in chunks:
            body += chunk
    except ResultStoreError as exc:
        log.warning("kept result of %s unreadable (%s)", record.operation_id, exc)
        return None
    finally:
        await close(chunks)
    return bytes(body)


async def opened(
    runtime: Runtime, record: OperationRecord, kept: KeptResult
) -> AsyncIterator[bytes] | None:
    """The copy's chunks, its first read already (so a copy that cannot be opened is known
    before an answer is begun), or None when it cannot be read."""
    try:
        chunks = (await runtime.keeper.store()).read(kept.name)
        first = await anext(chunks, b"")
    except ResultStoreError as exc:
        log.warning("kept result of %s unreadable (%s): forwarded", record.operation_id, exc)
        return None
    return Prepended(first, chunks)

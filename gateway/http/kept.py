"""The result route answered from a kept copy (SPEC 23): ``Statusgate-Result: kept``, the
copy's content type and length, no provider call. On aiohttp's server the copy is streamed
chunk by chunk; the agent lane writes whole answers, so there it is read whole first. A copy
that cannot be read (deleted under the gateway, the store down) answers nothing here: the
route then forwards as before."""

from __future__ import annotations

import logging

from aiohttp import web

from gateway.core.models import KeptResult, OperationRecord
from gateway.flow.runtime import OUTCOME
from gateway.http.answers import Call, operation_headers
from gateway.http.lane import LaneRequest
from gateway.store.results import ResultStoreError

log = logging.getLogger("statusgate")
KEPT_HEADER = "Statusgate-Result"


async def from_copy(
    call: Call, record: OperationRecord, kept: KeptResult
) -> web.StreamResponse | None:
    """The answer from ``kept``, or None when the copy cannot be read."""
    runtime = call.runtime
    headers = operation_headers(record, runtime.clock())
    headers[KEPT_HEADER] = "kept"
    headers["Content-Type"] = kept.content_type or "application/octet-stream"
    try:
        chunks = (await runtime.keeper.store()).read(kept.name)
        first = await anext(chunks, b"")
    except ResultStoreError as exc:
        log.warning("kept result of %s unreadable (%s): forwarded", record.operation_id, exc)
        return None
    call.request[OUTCOME] = "cached"
    if isinstance(call.request, LaneRequest):
        body = bytearray(first)
        async for chunk in chunks:
            body += chunk
        return web.Response(body=bytes(body), headers=headers)
    headers["Content-Length"] = str(kept.size)
    response = web.StreamResponse(headers=headers)
    request = call.request
    assert isinstance(request, web.BaseRequest)
    await response.prepare(request)
    await response.write(first)
    async for chunk in chunks:
        await response.write(chunk)
    await response.write_eof()
    return response

"""The demo provider's faults: answers that stall, break off, nest too deep or inflate
too far, for the tests of the gateway's limits (a step's ``stall_body``, ``reset_body``,
``nested`` or ``gzip_bomb``)."""

from __future__ import annotations

import asyncio
import functools
import zlib
from typing import Any

from aiohttp import web


async def _stall_body(request: web.Request, step: dict[str, Any]) -> web.StreamResponse:
    """Headers and half a body, then silence for ``stall_body`` seconds."""
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.content_length = 64
    await response.prepare(request)
    await response.write(b'{"state": "running", "pad": "')
    await asyncio.sleep(float(step["stall_body"]))
    return response


async def _reset_body(request: web.Request, step: dict[str, Any]) -> web.StreamResponse:
    """Headers and half a body, then the connection is cut."""
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.content_length = 64
    await response.prepare(request)
    await response.write(b'{"state": "running", "pad": "')
    assert request.transport is not None
    request.transport.abort()
    return response


async def _nested(request: web.Request, step: dict[str, Any]) -> web.StreamResponse:
    depth = int(step["nested"])
    return web.Response(text="[" * depth + "]" * depth, content_type="application/json")


async def _gzip_bomb(request: web.Request, step: dict[str, Any]) -> web.StreamResponse:
    """``gzip_bomb`` MB of spaces inside a JSON string, gzip-compressed (about 1000:1)."""
    headers = {"Content-Encoding": "gzip", "Content-Type": "application/json"}
    return web.Response(body=bomb(float(step["gzip_bomb"])), headers=headers)


@functools.lru_cache(maxsize=4)
def bomb(megabytes: float) -> bytes:
    """Made once per size, at submit, and without compressing it all: each MiB of spaces
    after a full flush deflates to the same bytes, so one MiB is compressed and its block
    repeated (compressing 50 MB took 0.26 s here, which ate a 0.3 s upstream timeout on
    a busy machine); only the gzip trailer's CRC reads the whole."""
    size = int(megabytes * 1024 * 1024)
    chunk = b" " * (1024 * 1024)
    head, tail = b'{"state": "running", "pad": "', b'"}'
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)  # raw deflate: the gzip frame is ours
    first = deflate.compress(head) + deflate.flush(zlib.Z_FULL_FLUSH)
    block = deflate.compress(chunk) + deflate.flush(zlib.Z_FULL_FLUSH)
    count = size // len(chunk)
    crc = zlib.crc32(head)
    for _ in range(count):
        crc = zlib.crc32(chunk, crc)
    crc = zlib.crc32(tail, crc)
    length = len(head) + count * len(chunk) + len(tail)
    last = deflate.compress(tail) + deflate.flush()
    frame = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"  # gzip, deflate, no name, no time
    trailer = crc.to_bytes(4, "little") + (length & 0xFFFFFFFF).to_bytes(4, "little")
    return frame + first + block * count + last + trailer


FAULTS = {
    "stall_body": _stall_body,
    "reset_body": _reset_body,
    "nested": _nested,
    "gzip_bomb": _gzip_bomb,
}

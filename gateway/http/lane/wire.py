"""The bytes a lane connection writes: an answer as aiohttp would write it (its own header
serializer, so Date, Server, Content-Length, Content-Type and Connection come out as on
aiohttp's listener), a 100 Continue, the last answer of a connection. Makes bytes, never
writes them (the connection queues them in order, flow.Outbox writes them).
"""

from __future__ import annotations

from aiohttp import hdrs, web
from aiohttp.helpers import (
    must_be_empty_body,
    rfc822_formatted_time,
    should_remove_content_length,
)
from aiohttp.http import SERVER_SOFTWARE
from aiohttp.http_writer import _serialize_headers

from gateway.http.problems import problem

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
MALFORMED = b"\x00 / HTTP/1.1\r\n\r\n"  # relayed in place of a malformed request: aiohttp 400s it
INTERNAL = "The gateway failed to handle this request."


def serialize(
    response: web.StreamResponse, method: str, version: tuple[int, int], keep_alive: bool
) -> tuple[bytes, bool]:
    """The bytes aiohttp would write for ``response`` (a whole ``web.Response``) to a
    ``method`` request of HTTP ``version`` that asked for the connection to be kept (or
    not), and whether the connection stays open after it."""
    if not isinstance(response, web.Response) or response.prepared:
        raise TypeError("the agent lane writes whole web.Response answers only")
    body = response.body
    if body is None:
        body = b""
    elif not isinstance(body, (bytes, bytearray)):
        raise TypeError("the agent lane writes bytes bodies only")
    headers = response.headers
    status = response.status
    empty = must_be_empty_body(method, status)
    sized = len(body) or (status != 304 and method != hdrs.METH_HEAD)
    if hdrs.CONTENT_LENGTH not in headers and sized:  # web.Response._start
        headers[hdrs.CONTENT_LENGTH] = str(len(body))
    if empty:  # StreamResponse._prepare_headers
        if hdrs.CONTENT_LENGTH in headers and should_remove_content_length(method, status):
            del headers[hdrs.CONTENT_LENGTH]
        headers.pop(hdrs.TRANSFER_ENCODING, None)
    elif len(body):
        headers.setdefault(hdrs.CONTENT_TYPE, "application/octet-stream")
    if hdrs.DATE not in headers:
        headers[hdrs.DATE] = rfc822_formatted_time()
    headers.setdefault(hdrs.SERVER, SERVER_SOFTWARE)
    keep = response.keep_alive if response.keep_alive is not None else keep_alive
    if hdrs.CONNECTION not in headers:
        if keep:
            if version == (1, 0):
                headers[hdrs.CONNECTION] = "keep-alive"
        elif version == (1, 1):
            headers[hdrs.CONNECTION] = "close"
    line = f"HTTP/{version[0]}.{version[1]} {status} {response.reason}"
    head = _serialize_headers(line, headers)
    return (head if empty else head + bytes(body)), bool(keep)


def closing_answer(response: web.Response) -> bytes:
    """``response`` as the last answer on a connection (Connection: close), to a request
    the lane could not read (or none)."""
    response.force_close()
    return serialize(response, hdrs.METH_GET, (1, 1), False)[0]


def bad_request(detail: str) -> bytes:
    return closing_answer(problem("invalid-request", detail))


def internal_error() -> web.Response:
    return problem("internal-error", INTERNAL)


def serialize_head(
    response: web.StreamResponse, method: str, version: tuple[int, int], keep_alive: bool
) -> tuple[bytes, bool, str]:
    """The head aiohttp would write for a streamed ``response`` (its body to come), whether
    the connection stays open after it, and how its body is framed: ``empty`` (none is
    sent: HEAD, 204, 304), ``length`` (Content-Length), ``chunked`` (HTTP/1.1 without a
    length) or ``close`` (HTTP/1.0 without one: the close ends it)."""
    headers = response.headers
    status = response.status
    empty = must_be_empty_body(method, status)
    keep = response.keep_alive if response.keep_alive is not None else keep_alive
    framing = "length"
    if empty:  # StreamResponse._prepare_headers
        framing = "empty"
        if hdrs.CONTENT_LENGTH in headers and should_remove_content_length(method, status):
            del headers[hdrs.CONTENT_LENGTH]
        headers.pop(hdrs.TRANSFER_ENCODING, None)
    elif response.content_length is None:
        if version >= (1, 1):
            framing = "chunked"
            headers[hdrs.TRANSFER_ENCODING] = "chunked"
        else:
            framing, keep = "close", False
    if not empty and response.content_length != 0:
        headers.setdefault(hdrs.CONTENT_TYPE, "application/octet-stream")
    if hdrs.DATE not in headers:
        headers[hdrs.DATE] = rfc822_formatted_time()
    headers.setdefault(hdrs.SERVER, SERVER_SOFTWARE)
    if hdrs.CONNECTION not in headers:
        if keep:
            if version == (1, 0):
                headers[hdrs.CONNECTION] = "keep-alive"
        elif version == (1, 1):
            headers[hdrs.CONNECTION] = "close"
    line = f"HTTP/{version[0]}.{version[1]} {status} {response.reason}"
    return _serialize_headers(line, headers), bool(keep), framing

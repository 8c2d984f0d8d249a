"""A request head as aiohttp's server reads it, so that one agent request means the same on
the lane as on aiohttp's listener: aiohttp's limits (max_line_size, max_field_size,
max_headers) as its C parser counts them, ``Host`` required in HTTP/1.1, no second
singleton field, trailing whitespace no part of a value, no fragment in the path; which
paths are agents' calls; and how a connection's first bytes decide who serves it. Pure
functions over bytes: no I/O, no state.
"""

from __future__ import annotations

import re

from aiohttp import hdrs
from aiohttp.http_parser import SINGLETON_HEADERS
from multidict import CIMultiDict
from yarl import URL

MAX_LINE = 8190  # bytes of a request target (aiohttp's max_line_size)
MAX_FIELD = 8190  # bytes of a header field's name or value (max_field_size, see field_fits)
MAX_FIELDS = 128  # header fields (max_headers)
TOO_LONG = "The request line or a header field is too long."
# The agent's paths, as the aiohttp routes /p/{provider} and /p/{provider}/{tail:.*} take
# them: a provider name with no slash and no brace, then nothing or a slash and anything.
AGENT_PATH = re.compile(r"/p/([^{}/]+)(?:/(.*))?", re.S)
# The methods agents' calls use; a connection opening with any other (one llhttp may not
# know, that aiohttp's router answers) is aiohttp's.
FIRST_LINE = re.compile(rb"(?:GET|HEAD|POST|PUT|PATCH|DELETE|OPTIONS) (\S*)")


class BadHead(Exception):
    """A request head the lane refuses as aiohttp would: a line or field past its limits,
    a second singleton field, or an HTTP/1.1 request without Host (RFC 9112, 3.2)."""


def field_fits(before: int, name: bytes, value: bytes, count: int) -> None:
    """Raise BadHead unless a header field is within aiohttp's limits as its C parser
    counts them when a name arrives in one read (``cb_on_header_field``,
    ``cb_on_header_value`` in aiohttp/_http_parser.pyx): a value of at most MAX_FIELD
    bytes, trailing whitespace included, and a name too, but the name counted with the
    name of the field before it (``before`` bytes; the parser checks a name before it files
    the field before) and the first field's value with its name; MAX_FIELDS fields
    (``count`` came before this one). All of them hold when ``before``, the name and the
    value together are within MAX_FIELD, which the lane checks first (the common case)."""
    if before:
        named, valued = before + len(name), len(value)
    else:
        named = len(name)
        valued = named + len(value)
    if named > MAX_FIELD or valued > MAX_FIELD or count >= MAX_FIELDS:
        raise BadHead(TOO_LONG)


def headers_of(fields: list[tuple[bytes, bytes]], version: str) -> CIMultiDict[str]:
    """The header fields as aiohttp's request has them (names latin-1, values UTF-8 with
    surrogate escapes); BadHead for a second singleton field or a missing Host."""
    headers: CIMultiDict[str] = CIMultiDict()
    for name, value in fields:
        key = name.decode("latin-1")
        if key in headers and key.lower() in SINGLETON_HEADERS:
            raise BadHead(f"The request carries {key} twice.")
        headers.add(key, value.decode("utf-8", "surrogateescape"))
    if version != "1.0" and hdrs.HOST not in headers:
        raise BadHead("An HTTP/1.1 request must carry a Host header.")
    return headers


def body_framing(fields: list[tuple[bytes, bytes]]) -> bytes | None:
    """The field framing the body of a request with these header fields, if it has one."""
    framing = None
    for name, value in fields:
        lower = name.lower()
        if lower == b"transfer-encoding" and b"chunked" in value.lower():
            return b"Transfer-Encoding: chunked"
        if lower == b"content-length" and value.strip() not in (b"", b"0"):
            framing = b"Content-Length: " + value.strip()
    return framing


def agent_url(target: bytes) -> tuple[URL, str, str] | None:
    """The URL, provider and tail of an agent call to ``target`` (a request target that
    starts with ``/p/``; a fragment is no part of it), matched as aiohttp's router matches
    ``/p/{provider}`` and ``/p/{provider}/{tail:.*}`` (on ``path_safe``); None otherwise."""
    raw_path, _, query = target.partition(b"#")[0].partition(b"?")
    rel_url = URL.build(
        path=raw_path.decode("latin-1"), query_string=query.decode("latin-1"), encoded=True
    )
    match = AGENT_PATH.fullmatch(rel_url.path_safe)
    return None if match is None else (rel_url, match.group(1), match.group(2) or "")


def wants_lane(first: bytes) -> bool | None:
    """Whether a connection whose first bytes are ``first`` starts with an agent call; None
    while too few have come to tell."""
    match = FIRST_LINE.match(first)
    if match is None:
        method = first.partition(b" ")[0]
        waiting = b" " not in first and len(first) <= 16 and method.isalpha() and method.isupper()
        return None if waiting or not first else False
    target = match.group(1)
    if match.end() == len(first) and b"/p/".startswith(target):
        return None  # "GET /p" so far
    return target.startswith(b"/p/")

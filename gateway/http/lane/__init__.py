"""The agent lane: the HTTP/1.1 connections that carry agents' ``/p/{provider}/...`` calls,
parsed with httptools (llhttp) and answered through the same middleware and handlers as
aiohttp would, without aiohttp's per-request server machinery (SPEC 1, 12, 13).

Why: a too-early refusal cost ~110 us of CPU of which aiohttp's server path (its request and
response objects, its router, its stream writer) was a third; the same llhttp parser with a
request of ten attributes and a response written as one ``bytes`` costs a few microseconds.

What it owns, split as uvicorn splits its httptools server:

- ``protocol``: a connection (``Lane``): framing (keep-alive, pipelining in order with
  reading paused past QUEUE_HIGH waiting requests, ``Expect: 100-continue``, ``Connection:
  close``, a request asking to upgrade answered as HTTP/1.1), a client's FIN (taken as its
  going away, as aiohttp takes it, but a poll under way still answered), the timeouts of a
  head and of an idle connection (``limits.header_timeout``, ``keepalive_timeout``), and a
  graceful stop with the aiohttp runner it shares;
- ``cycle``: a request's answer in a task of its own, and when that task may be cancelled
  (``handler_cancellation``, deferred while the handler polls the provider);
- ``flow``: reading paused and resumed, writing waited for, and the answers of a turn of
  the event loop written together at its end (``Outbox``);
- ``stream``: a streamed answer (``Streamed``, a body from an async iterator, as a kept
  result is served) written chunk by chunk, waiting while the socket's buffer is full, its
  iterator closed however it ends;
- ``body``: a body read as it arrives, with backpressure (an answered request's unread
  rest dropped for a while at most);
- ``head``: the head as aiohttp reads it (aiohttp's limits as its C parser counts them,
  ``Host`` required in HTTP/1.1, no second singleton field, no trailing whitespace in a
  value, no fragment in the path) and which paths are agents' calls;
- ``request``: ``LaneRequest``, what the handlers read (gateway/flow/requests.AgentRequest);
- ``wire``: an answer's bytes, written by aiohttp's own header serializer, so an answer
  here has the bytes aiohttp would send (Date, Server, Content-Length, Content-Type,
  Connection); tests/http/test_lane_internals.py names the aiohttp internals used;
- ``relay``: requests for any other path relayed to aiohttp's server;
- ``connections``: the bound on open connections (``limits.max_connections``);
- ``site``: the listener (``LaneSite``), a site of aiohttp's runner.

What it never does: answer anything but an agent call. A connection whose first request is
not ``/p/...`` is handed to aiohttp whole (its bytes passed through); one that turns to
another path later is relayed to an aiohttp handler from that request on, in order, so the
admin API, the console, ``/mcp``, the health checks and the metrics are aiohttp's alone.
"""

from __future__ import annotations

from gateway.http.lane.body import BODY_HIGH
from gateway.http.lane.cycle import Handler, Middleware
from gateway.http.lane.head import MAX_FIELD, MAX_FIELDS, MAX_LINE, wants_lane
from gateway.http.lane.protocol import QUEUE_HIGH
from gateway.http.lane.request import LaneRequest
from gateway.http.lane.site import LaneSite
from gateway.http.lane.stream import Streamed

__all__ = [
    "BODY_HIGH",
    "MAX_FIELD",
    "MAX_FIELDS",
    "MAX_LINE",
    "QUEUE_HIGH",
    "Handler",
    "LaneRequest",
    "LaneSite",
    "Middleware",
    "Streamed",
    "wants_lane",
]

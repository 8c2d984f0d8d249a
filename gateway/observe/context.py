"""What one agent or operator request learns about itself while it is handled: its request
id (SPEC 13), the account, and the provider call it caused, for its log line and its audit
lines.

The middleware puts a fresh ``RequestContext`` in a context variable; code below reads or
fills it in place. Tasks started for the request (a shared poll) inherit the same object,
so the provider call they make is seen by the request that started them.
"""

from __future__ import annotations

import contextvars
import os
import random
import re
import secrets
from dataclasses import dataclass

REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")


@dataclass
class RequestContext:
    request_id: str
    account: str | None = None
    provider_status: int | None = None
    provider_ms: float | None = None


CURRENT: contextvars.ContextVar[RequestContext | None] = contextvars.ContextVar(
    "statusgate_request", default=None
)


def request_id_from(header: str | None) -> str:
    """The agent's ``X-Request-Id`` when it is well-formed, else a new one."""
    if header is not None and REQUEST_ID.fullmatch(header):
        return header
    return f"{_ids.getrandbits(96):024x}"


# Request ids must be unique, not secret: a fast generator seeded from the OS per process.
_ids = random.Random(secrets.randbits(128))
# a forked worker (statusgate serve --workers N) must not repeat its parent's sequence
os.register_at_fork(after_in_child=lambda: _ids.seed(secrets.randbits(128)))


def current_request_id() -> str | None:
    context = CURRENT.get()
    return None if context is None else context.request_id


def note_provider_call(status: int | None, seconds: float) -> None:
    """Record on the current request the provider call it made (the last one wins)."""
    context = CURRENT.get()
    if context is not None:
        context.provider_status = status
        context.provider_ms = round(seconds * 1000, 3)


def note_account(account: str) -> None:
    context = CURRENT.get()
    if context is not None:
        context.account = account

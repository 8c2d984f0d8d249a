"""Who is asking over MCP and what they may touch: the account's own operations only.

Owns the two ways a tool or task reaches an operation: reading it (another account's
operation is indistinguishable from none) and waiting for it through polls.wait_for, the
same hold, schedule, budgets and shared poll as ``Prefer: wait``. Never polls a provider any
other way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gateway.core.models import OperationRecord
from gateway.core.problems import PROBLEMS
from gateway.flow import polls
from gateway.flow.runtime import Runtime
from gateway.http.mcp.sessions import MODERN
from gateway.settings.config import Account
from gateway.settings.policy import ProviderPolicy

MAX_ID = 200  # characters of an operation id worth looking up


@dataclass(frozen=True, slots=True)
class Caller:
    runtime: Runtime
    account: Account
    version: str  # the session's protocol revision, or the request's (2026-07-28)
    extension: bool  # the tasks extension is declared (at initialize or on this request)
    gone: Callable[[], bool]  # the client went away
    request: web.Request  # the POST /mcp it came with (start_job and get_result run in it)

    @property
    def modern(self) -> bool:
        """The stateless revision (2026-07-28): no session, per-request capabilities."""
        return self.version in MODERN


class Refused(Exception):
    """A tool-level failure named by a problem slug (answered as an ``isError`` result)."""

    def __init__(self, slug: str, detail: str, operation_id: str | None = None) -> None:
        super().__init__(detail)
        self.slug = slug
        self.detail = detail
        self.operation_id = operation_id

    def problem(self) -> dict[str, Any]:
        kind = PROBLEMS[self.slug]
        body: dict[str, Any] = {
            "type": f"/problems/{self.slug}",
            "title": kind.title,
            "status": kind.status,
            "detail": self.detail,
        }
        if self.operation_id is not None:
            body["operation_id"] = self.operation_id
        return body


async def owned(caller: Caller, operation_id: str) -> OperationRecord | None:
    """The caller's operation of that id; None for none and for another account's."""
    if not 0 < len(operation_id) <= MAX_ID:
        return None
    record = await caller.runtime.records.get(operation_id)
    if record is None or record.account != caller.account.id:
        return None
    return record


def policy_of(caller: Caller, record: OperationRecord) -> ProviderPolicy | None:
    return caller.runtime.settings.policies.get(record.provider)


async def wait(caller: Caller, record: OperationRecord, seconds: float) -> OperationRecord:
    """The operation after waiting up to ``seconds`` (capped at ``max_hold``) as
    ``Prefer: wait`` does; 0 is one look (at most the one poll that is due)."""
    policy = policy_of(caller, record)
    if policy is None:
        detail = f"No policy is loaded for {record.provider!r}; the operation cannot be polled."
        raise Refused("unknown-provider", detail, record.operation_id)
    if not caller.account.allows(record.provider):
        detail = f"This account may no longer use provider {record.provider!r}."
        raise Refused("forbidden", detail, record.operation_id)
    runtime = caller.runtime
    decision, _ = await polls.wait_for(
        runtime, caller.account, policy, record, seconds, gone=caller.gone
    )
    return decision.record


async def look(caller: Caller, record: OperationRecord) -> OperationRecord:
    """The freshest record for a task poll: one look, or the record as it is when the
    operation cannot be polled (no policy, or a provider the account lost)."""
    try:
        return await wait(caller, record, 0.0)
    except Refused:
        return record

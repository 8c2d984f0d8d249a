"""``protocol: a2a`` policies (SPEC 24): the ``a2a:`` section and what the protocol fixes.

An A2A policy fronts a remote agent. The protocol fixes the routes the gateway uses at the
remote agent (its HTTP+JSON binding, A2A 1.0), the state field and the task states, so a
policy file writes only ``provider``, ``upstream``, ``credential`` and, when it wants,
``polling``, ``escalation``, ``retention``, ``routes.cancel.by`` and ``a2a:``. What the
protocol fixes is filled under the file, as a shape's defaults are (``shapes.with_shape``):
whatever the file writes wins, and ``statusgate policy show`` prints the result.

Pure data and a merge: no I/O, nothing read from the environment.
"""

from __future__ import annotations

from typing import Any, Literal

from gateway.settings.loading import Strict

Protocol = Literal["http", "a2a"]

# A2A 1.0 TaskState names (a2a.proto), as the HTTP+JSON binding's JSON carries them.
SUBMITTED = "TASK_STATE_SUBMITTED"
WORKING = "TASK_STATE_WORKING"
INPUT_REQUIRED = "TASK_STATE_INPUT_REQUIRED"
AUTH_REQUIRED = "TASK_STATE_AUTH_REQUIRED"
COMPLETED = "TASK_STATE_COMPLETED"
FAILED = "TASK_STATE_FAILED"
CANCELED = "TASK_STATE_CANCELED"
REJECTED = "TASK_STATE_REJECTED"
AWAITING_CALLER = (INPUT_REQUIRED, AUTH_REQUIRED)
VERSION = "1.0"  # the protocol version the gateway speaks to remote agents


class A2ASettings(Strict):
    """The ``a2a:`` section of an A2A policy."""

    on_input_required: Literal["wait", "escalate"] = "wait"
    """INPUT_REQUIRED / AUTH_REQUIRED: ``wait`` for the caller's reply (no polls spent
    meanwhile), or ``escalate`` (reason ``input_required``) to operators."""
    push: bool = True
    """Register the gateway as each task's push target where the remote agent's card says
    it supports push notifications."""
    card_ttl: float = 60.0
    """Seconds a fetched agent card is served from memory before it is fetched again."""


# What an a2a policy need not write: the remote agent's HTTP+JSON binding (A2A 1.0).
FILLS: dict[str, Any] = {
    "routes": {
        "submit": {
            "method": "POST",
            "path": "/message:send",
            "job_id": {"from": "body", "path": "task.id"},
            "match": {"headers": {"A2A-Version": VERSION}},
            "idempotency": {"required": False, "retention": "24h"},
        },
        "status": {
            "method": "GET",
            "path": "/tasks/{job_id}",
            "match": {"headers": {"A2A-Version": VERSION}},
        },
        "cancel": {
            "method": "POST",
            "path": "/tasks/{job_id}:cancel",
            "match": {"headers": {"A2A-Version": VERSION}},
        },
    },
    "states": {
        "field": "status.state",
        "pending": [SUBMITTED, WORKING, *AWAITING_CALLER],
        "success": [COMPLETED],
        "failure": [FAILED, REJECTED],
        "cancelled": [CANCELED],
        "expired": [],
        "success_requires": [],
        "error_field": "status.message",
    },
    "polling": {"early_calls": "replay"},
}

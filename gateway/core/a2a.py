"""A2A as data (SPEC 24): which calls the gateway paces, replays, forwards or refuses, what
a task's state means while the task waits for its caller, and a problem as an A2A error.

The poll rules themselves are decide.py's, unchanged: a task is an operation, GetTask a
status call, the task states a state table (settings/a2a.py). What A2A adds is one rule,
kept here and asked by ``decide.admit`` and ``decide._classify_body``: a task at
INPUT_REQUIRED or AUTH_REQUIRED waits for its caller, so no poll is spent on it (the last
task recorded answers), or, under ``on_input_required: escalate``, it goes to operators.

Pure: no I/O, no clock, no asyncio.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Any

from gateway.core.models import OperationRecord
from gateway.settings.a2a import AWAITING_CALLER, A2ASettings
from gateway.settings.policy import ProviderPolicy

DEFAULTS = A2ASettings()
MAX_MESSAGE = 500  # characters of the remote agent's message kept in an escalation


def settings(policy: ProviderPolicy) -> A2ASettings:
    return policy.a2a or DEFAULTS


def awaits_caller(policy: ProviderPolicy, record: OperationRecord) -> bool:
    """The task waits for its caller's reply (INPUT_REQUIRED / AUTH_REQUIRED under
    ``on_input_required: wait``): polling it would spend the budget on an answer nobody
    but the caller can change."""
    return (
        policy.protocol == "a2a"
        and settings(policy).on_input_required == "wait"
        and record.last_known_state in AWAITING_CALLER
    )


def escalates_input(policy: ProviderPolicy, state: Any) -> bool:
    """A task answer at ``state`` goes to operators (``on_input_required: escalate``)."""
    return (
        policy.protocol == "a2a"
        and settings(policy).on_input_required == "escalate"
        and state in AWAITING_CALLER
    )


def message_text(task: Any) -> str:
    """The text parts of a task's status message (what the remote agent asked), bounded."""
    status = task.get("status") if isinstance(task, dict) else None
    message = status.get("message") if isinstance(status, dict) else None
    parts = message.get("parts") if isinstance(message, dict) else None
    if not isinstance(parts, list):
        return ""
    texts = [p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)]
    text = " ".join(" ".join(texts).split())
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


def input_detail(state: str, task: Any) -> str:
    """The escalation's detail for a task that needs input: the state and its message."""
    said = message_text(task)
    return f"the remote agent's task is {state}" + (f": {said}" if said else "")


# -- the methods ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Method:
    """One A2A method as the gateway serves it."""

    kind: str  # send | get | cancel | refused
    what: str  # what the gateway does, for docs/a2a.md's table


SEND, GET, CANCEL, REFUSED = "send", "get", "cancel", "refused"
METHODS: dict[str, Method] = {
    "SendMessage": Method(SEND, "a submit (new task) or a follow-up that resumes pacing"),
    "GetTask": Method(GET, "a status call: paced, early calls replayed, ended ones answered"),
    "CancelTask": Method(CANCEL, "per routes.cancel.by: forwarded once, or refused"),
    "SendStreamingMessage": Method(REFUSED, "refused: a stream would bypass pacing"),
    "SubscribeToTask": Method(REFUSED, "refused: a stream would bypass pacing"),
    "ListTasks": Method(REFUSED, "refused: it would list every account's tasks"),
    "CreateTaskPushNotificationConfig": Method(REFUSED, "refused: the gateway is the target"),
    "GetTaskPushNotificationConfig": Method(REFUSED, "refused: the gateway is the target"),
    "ListTaskPushNotificationConfigs": Method(REFUSED, "refused: the gateway is the target"),
    "DeleteTaskPushNotificationConfig": Method(REFUSED, "refused: the gateway is the target"),
    "GetExtendedAgentCard": Method(REFUSED, "refused: the card is served at the well-known URL"),
}
V03_NAMES: dict[str, str] = {  # A2A 0.3 JSON-RPC method names
    "message/send": "SendMessage",
    "tasks/get": "GetTask",
    "tasks/cancel": "CancelTask",
    "message/stream": "SendStreamingMessage",
    "tasks/resubscribe": "SubscribeToTask",
    "tasks/pushNotificationConfig/set": "CreateTaskPushNotificationConfig",
    "tasks/pushNotificationConfig/get": "GetTaskPushNotificationConfig",
    "tasks/pushNotificationConfig/list": "ListTaskPushNotificationConfigs",
    "tasks/pushNotificationConfig/delete": "DeleteTaskPushNotificationConfig",
    "agent/getAuthenticatedExtendedCard": "GetExtendedAgentCard",
}


def method(name: str) -> tuple[str, bool] | None:
    """The 1.0 name of a JSON-RPC method and whether it came by its 0.3 name; None when A2A
    has no such method."""
    if name in METHODS:
        return name, False
    if name in V03_NAMES:
        return V03_NAMES[name], True
    return None


# -- errors --------------------------------------------------------------------------------

TASK_NOT_FOUND = -32001
TASK_NOT_CANCELABLE = -32002
UNSUPPORTED_OPERATION = -32004
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INVALID_REQUEST = -32600
PARSE_ERROR = -32700
INTERNAL = -32603
CODES = {  # problem slug -> the A2A / JSON-RPC code that says it
    "unknown-operation": TASK_NOT_FOUND,
    "approval-required": TASK_NOT_CANCELABLE,
    "invalid-request": INVALID_PARAMS,
}
ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"


def error_of_problem(problem: dict[str, Any]) -> dict[str, Any]:
    """A problem+json body as a JSON-RPC error (SPEC 24): the A2A code that says it, or
    -32603; ``data`` a list holding a google.rpc.ErrorInfo (reason the slug in upper snake
    case, metadata the problem's members as strings) and the problem object itself."""
    slug = str(problem.get("type", "")).rsplit("/", 1)[-1] or "internal"
    metadata = {
        str(k): v if isinstance(v, str) else _text(v)
        for k, v in problem.items()
        if k != "error" and v is not None
    }
    info = {
        "@type": ERROR_INFO,
        "reason": slug.upper().replace("-", "_"),
        "domain": "statusgate",
        "metadata": metadata,
    }
    message = str(problem.get("detail") or problem.get("title") or slug)
    return {"code": CODES.get(slug, INTERNAL), "message": message, "data": [info, problem]}


def _text(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    return str(value)


# -- push notifications --------------------------------------------------------------------


def push_token(key: bytes, provider: str, account: str) -> str:
    """The token the gateway gives a remote agent with its push URL, and checks on every
    push: it names the account (pushes carry no other trace of it) and is an HMAC only the
    gateway can make. ``key``: secret to the gateway (derived from the policy's credential)."""
    mac = hmac.new(key, f"a2a-push\n{provider}\n{account}".encode(), hashlib.sha256)
    return f"{account}.{mac.hexdigest()[:40]}"


def push_account(key: bytes, provider: str, token: str) -> str | None:
    """The account a push token was made for, or None when it is not one of the gateway's."""
    account, _, _ = token.rpartition(".")
    if not account or not (token.isascii() and token.isprintable()):
        return None
    expected = push_token(key, provider, account)
    return account if hmac.compare_digest(expected.encode(), token.encode()) else None


def push_key(policy: ProviderPolicy) -> bytes:
    """The HMAC key of a policy's push tokens: from its credential, which only the gateway
    holds (a new credential makes new tokens, as it should)."""
    secret = "\n".join(policy.secrets) or policy.credential_fingerprint
    return hashlib.sha256(f"statusgate-a2a-push\n{secret}".encode()).digest()

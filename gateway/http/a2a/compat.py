"""A2A 0.3 calls and answers in 1.0's shape and back, with a2a-sdk's own conversions
(``a2a.compat.v0_3``; the optional extra ``statusgate[a2a]``). 1.0 calls need none of it."""

from __future__ import annotations

from typing import Any


class Unconvertible(Exception):
    """A 0.3 call the conversion refused (or a2a-sdk is not installed)."""


def require() -> None:
    """Raises Unconvertible, before anything is sent or spent, when a2a-sdk (which the 0.3
    conversions come from) is not installed."""
    try:
        from a2a.compat.v0_3 import conversions  # noqa: F401
    except ImportError as exc:
        raise Unconvertible("0.3 calls need a2a-sdk: pip install statusgate[a2a]") from exc


def send_params(params: dict[str, Any]) -> dict[str, Any]:
    """0.3 ``message/send`` params as a 1.0 SendMessageRequest (JSON)."""
    try:
        from a2a.compat.v0_3 import conversions
        from a2a.compat.v0_3 import types as v03
        from google.protobuf.json_format import MessageToDict
    except ImportError as exc:
        raise Unconvertible("0.3 calls need a2a-sdk: pip install statusgate[a2a]") from exc
    try:
        request = v03.SendMessageRequest(id=0, params=v03.MessageSendParams.model_validate(params))
        converted: dict[str, Any] = MessageToDict(conversions.to_core_send_message_request(request))
    except Exception as exc:  # pydantic's and protobuf's errors alike: the caller's input
        raise Unconvertible(f"params are not a 0.3 MessageSendParams: {str(exc)[:200]}") from exc
    return converted


def old_task(task: dict[str, Any]) -> Any:
    """A 1.0 Task (JSON) in 0.3's shape."""
    from a2a.compat.v0_3 import conversions
    from a2a.types import a2a_pb2
    from google.protobuf.json_format import ParseDict

    core = ParseDict(task, a2a_pb2.Task(), ignore_unknown_fields=True)
    return conversions.to_compat_task(core).model_dump(
        mode="json", by_alias=True, exclude_none=True
    )


def old_message(message: dict[str, Any]) -> Any:
    """A 1.0 Message (JSON) in 0.3's shape."""
    from a2a.compat.v0_3 import conversions
    from a2a.types import a2a_pb2
    from google.protobuf.json_format import ParseDict

    core = ParseDict(message, a2a_pb2.Message(), ignore_unknown_fields=True)
    converted = conversions.to_compat_message(core)
    return converted.model_dump(mode="json", by_alias=True, exclude_none=True)

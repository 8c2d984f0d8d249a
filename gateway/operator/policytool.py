"""What ``statusgate policy test`` and ``statusgate schema`` compute (SPEC section 12).

Pure: a policy and a sample status answer in, the one-line verdict out; a settings model in,
its JSON Schema out. No provider is contacted; the sample is classified by the same rules
(decide.classify) a live status answer would be.
"""

from __future__ import annotations

import json
from typing import Any

import pydantic

from gateway.core import decide
from gateway.core.models import Outcome, ProviderAnswer
from gateway.settings.loading import DURATION_PATTERN, SIZE_PATTERN
from gateway.settings.policy import ProviderPolicy
from gateway.settings.units import format_duration, format_size

ESCALATED = 3  # the exit status of ``policy test`` when the verdict is an escalation
SAMPLE_NOW = 1_800_000_000.0  # any instant: the sample is classified right after submit
DRAFT = "https://json-schema.org/draft/2020-12/schema"


def verdict(policy: ProviderPolicy, body: bytes, status: int = 200) -> str:
    """``pending``, ``succeeded``, ``failed``, ``cancelled``, ``expired`` or
    ``escalate <reason>: <why>`` for one sample answer to a fresh operation's first poll."""
    opened = decide.open_operation(
        policy,
        operation_id="op_sample",
        account="sample",
        job_id="sample",
        fingerprint="sample",
        idempotency_key=None,
        answer=ProviderAnswer(202, b"{}", "application/json"),
        now=SAMPLE_NOW,
        u=1.0,
    ).record
    answer = ProviderAnswer(status, body, "application/json")
    record = decide.classify(policy, opened, answer, SAMPLE_NOW + 1, 1.0).record
    if record.outcome is Outcome.ESCALATED and record.escalation is not None:
        return f"escalate {record.escalation.reason.value}: {record.escalation.detail}"
    return record.outcome.value


def exit_status(line: str) -> int:
    """0 for a verdict the gateway acts on alone (pending or an outcome), ESCALATED for one
    that needs a person, so a script can tell them apart."""
    return ESCALATED if line.startswith("escalate ") else 0


def schema(model: type[pydantic.BaseModel], title: str) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a settings model, as written in YAML: durations and
    sizes have their defaults spelled as ``check`` reads them ("5s", "8MiB")."""
    generated = model.model_json_schema(by_alias=True, mode="validation")
    return {"$schema": DRAFT, **_written_defaults(generated), "title": title}


def _written_defaults(node: Any) -> Any:
    if isinstance(node, list):
        return [_written_defaults(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _written_defaults(value) for key, value in node.items()}
    if "$ref" in out and isinstance(out.get("default"), dict):
        del out["default"]  # the referenced object lists each field's default, as written
    default = out.get("default")
    if isinstance(default, int | float) and not isinstance(default, bool):
        if out.get("pattern") == DURATION_PATTERN:
            out["default"] = format_duration(float(default))
        elif out.get("pattern") == SIZE_PATTERN:
            out["default"] = format_size(int(default))
    return out


def dumps(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, sort_keys=True)

"""Shapes: the defaults of one family of provider APIs, as data (SPEC 22).

``shape: <name>`` in a policy file fills what the file leaves out from the family's table
below, deep-merged UNDER the file before ``${...}`` interpolation and validation: whatever
the file writes wins. Mappings merge key by key; lists, scalars and ``null`` replace
(``cancel: null`` removes a route a shape fills); a ``job_id`` source is replaced whole.

A shape fills only what every member of its family shares; what differs (submit paths,
which job id field, most state lists) each policy writes. Each shape also says what its
lints (gateway/settings/lints.py) expect: the state vocabularies it knows in full, or, for
families whose members' states differ, the terminal classes a member is expected to list
(an explicitly written empty list says "this provider has none").

Pure data and a merge: no I/O, nothing read from the environment.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Literal, get_args

from gateway.settings import a2a

ShapeName = Literal["openai-job", "google-operation", "google-job", "aws-job", "queue"]
SHAPE_NAMES: tuple[str, ...] = get_args(ShapeName)
REPLACED_WHOLE = frozenset({"job_id"})  # a job id source is one thing, never a blend


@dataclass(frozen=True, slots=True)
class Vocabulary:
    """A state field's full set of documented values, by class, as one API family has it."""

    name: str
    states: dict[str, tuple[Any, ...]]  # class -> values

    def values(self) -> list[tuple[str, Any]]:
        return [(kind, value) for kind, values in self.states.items() for value in values]


@dataclass(frozen=True, slots=True)
class Shape:
    name: str
    summary: str
    fills: dict[str, Any]
    vocabularies: tuple[Vocabulary, ...] = ()
    expects: tuple[str, ...] = ()  # terminal classes each member is expected to list


_JOB_STATE = Vocabulary(
    "Vertex AI JobState (JOB_STATE_*)",
    {
        "pending": (
            "JOB_STATE_QUEUED",
            "JOB_STATE_PENDING",
            "JOB_STATE_RUNNING",
            "JOB_STATE_CANCELLING",
            "JOB_STATE_PAUSED",
            "JOB_STATE_UPDATING",
        ),
        "success": ("JOB_STATE_SUCCEEDED", "JOB_STATE_PARTIALLY_SUCCEEDED"),
        "failure": ("JOB_STATE_FAILED",),
        "cancelled": ("JOB_STATE_CANCELLED",),
        "expired": ("JOB_STATE_EXPIRED",),
    },
)
_BATCH_STATE = Vocabulary(
    "Gemini API BatchState (BATCH_STATE_*)",
    {
        "pending": ("BATCH_STATE_PENDING", "BATCH_STATE_RUNNING"),
        "success": ("BATCH_STATE_SUCCEEDED",),
        "failure": ("BATCH_STATE_FAILED",),
        "cancelled": ("BATCH_STATE_CANCELLED",),
        "expired": ("BATCH_STATE_EXPIRED",),
    },
)
_DONE = Vocabulary(
    "google.longrunning.Operation done",
    {"pending": (False, None), "success": (True,)},  # None: proto3 JSON leaves out false
)
_GOOGLE_ROUTES = {
    "submit": {"job_id": {"from": "body", "path": "name"}},
    "status": {"method": "GET", "path": "/v1/{job_id*}"},
    "cancel": {"method": "POST", "path": "/v1/{job_id*}:cancel"},
}

SHAPES: dict[str, Shape] = {
    shape.name: shape
    for shape in (
        Shape(
            "openai-job",
            "a job object with an id and a status (OpenAI batches, responses, fine-tuning "
            "and the APIs modelled on them)",
            {
                "routes": {"submit": {"job_id": {"from": "body", "path": "id"}}},
                "states": {"field": "status"},
                "polling": {"early_calls": "replay"},
                "answers": {"poll_after_ms_header": "openai-poll-after-ms"},
            },
            expects=("failure", "cancelled", "expired"),
        ),
        Shape(
            "google-operation",
            "a google.longrunning.Operation: a resource name, done / error / response",
            {
                "routes": _GOOGLE_ROUTES,
                "states": {
                    "field": "done",
                    "pending": [False, None],
                    "success": [True],
                    "failure_if_present": ["error"],
                    "success_requires": ["response"],
                    "error_field": "error",
                },
                "polling": {"early_calls": "replay"},
            },
            vocabularies=(_DONE,),
        ),
        Shape(
            "google-job",
            "a Google job resource named by a resource name, with a state of JOB_STATE_* "
            "(Vertex AI) or BATCH_STATE_* (Gemini API batches)",
            {
                "routes": _GOOGLE_ROUTES,
                "states": {
                    "field": "state",
                    **{kind: list(values) for kind, values in _JOB_STATE.states.items()},
                    "error_field": "error",
                },
                "polling": {"early_calls": "replay"},
            },
            vocabularies=(_JOB_STATE, _BATCH_STATE),
        ),
        Shape(
            "aws-job",
            "an AWS job API signed with SigV4, with a status, whose job id may be an ARN",
            {
                "credential": {
                    "aws_sigv4": {
                        "access_key_id": "${AWS_ACCESS_KEY_ID}",
                        "secret_access_key": "${AWS_SECRET_ACCESS_KEY}",
                    }
                },
                "routes": {"job_ids": "aws-arn"},
                "states": {"field": "status"},
                "polling": {"early_calls": "replay"},
            },
            expects=("failure", "cancelled", "expired"),
        ),
        Shape(
            "queue",
            "a queue whose answers carry the job's own URLs (fal's queue, Replicate's predictions)",
            {
                "routes": {
                    "submit": {
                        "status_url_fields": [
                            "status_url",
                            "response_url",
                            "cancel_url",
                            "urls.get",
                            "urls.cancel",
                        ]
                    }
                },
                "states": {"field": "status"},
                "polling": {"early_calls": "replay"},
            },
            expects=("failure", "cancelled"),
        ),
    )
}


def with_shape(raw: dict[str, Any]) -> dict[str, Any]:
    """The policy file ``raw`` with its shape's defaults filled in under it, and under those
    what its protocol fixes (``protocol: a2a``, settings/a2a.py); ``raw`` itself when it
    names neither, or ones that do not exist (validation reports that)."""
    name = raw.get("shape")
    shape = SHAPES.get(name) if isinstance(name, str) else None
    merged = raw if shape is None else merge_under(shape.fills, raw)
    if raw.get("protocol") == "a2a":
        merged = merge_under(a2a.FILLS, merged)
    assert isinstance(merged, dict)
    return merged


def merge_under(under: Any, over: Any, key: str = "") -> Any:
    """``over`` with the keys it leaves out taken from ``under``, mapping by mapping."""
    if isinstance(under, dict) and isinstance(over, dict) and key not in REPLACED_WHOLE:
        out = {k: copy.deepcopy(v) for k, v in under.items() if k not in over}
        for k, v in over.items():
            out[k] = merge_under(under[k], v, k) if k in under else copy.deepcopy(v)
        return out
    return copy.deepcopy(over)


def filled_paths(
    tree: dict[str, Any] | None = None, prefix: tuple[str, ...] = ()
) -> set[tuple[str, ...]]:
    """Every field path some shape fills (for the JSON Schema: a shaped file may omit it)."""
    found: set[tuple[str, ...]] = set()
    trees = [s.fills for s in SHAPES.values()] + [a2a.FILLS] if tree is None else [tree]
    for node in trees:
        for key, value in node.items():
            path = (*prefix, key)
            found.add(path)
            if isinstance(value, dict) and key not in REPLACED_WHOLE:
                found |= filled_paths(value, path)
    return found

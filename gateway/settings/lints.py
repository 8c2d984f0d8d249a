"""What ``statusgate check`` warns about in a valid policy's state table (SPEC 22, Lints).

Warnings, not errors: the policy works, but a documented provider state or a result it
points to is likely to end a wait as an escalation instead of an outcome. Each finding is a
(field path, message) pair, printed by ``check`` (``check_warnings``).

- A state a shape knows in full (google-job's JOB_STATE_*, google-operation's ``done``) in
  no class of the policy.
- A terminal class a shape expects (openai-job, aws-job, queue) that the policy leaves
  absent. An explicitly written empty list (``expired: []``) says the provider has none
  and is not warned about.
- An empty ``success`` class; an empty ``failure`` class that is not written as ``[]``
  and not covered by ``failure_if_present``.
- A result route whose answer the success class does not require: ``{final.<field>}``
  without that field in ``success_requires``, or a result route with no
  ``success_requires`` at all.
"""

from __future__ import annotations

import json

from gateway.settings.policy import ProviderPolicy, placeholders, warnings
from gateway.settings.shapes import SHAPES, Shape, Vocabulary


def check_warnings(policy: ProviderPolicy) -> list[tuple[str, str]]:
    """Everything ``statusgate check`` warns about in ``policy``: passthrough routes that
    serve one account's objects to another (policy.warnings, SPEC 20) and these lints."""
    return warnings(policy) + lint(policy)


def lint(policy: ProviderPolicy) -> list[tuple[str, str]]:
    """Every warning about ``policy``'s state table and result route, as (field, message)."""
    found = _class_warnings(policy)
    shape = SHAPES.get(policy.shape) if policy.shape is not None else None
    if shape is not None:
        found += _shape_warnings(policy, shape)
    return found + _result_warnings(policy)


def _class_warnings(policy: ProviderPolicy) -> list[tuple[str, str]]:
    states = policy.states
    found: list[tuple[str, str]] = []
    if not states.success:
        found.append(("states.success", "is empty: no answer can ever end the job as a success"))
    written = states.model_fields_set
    if not states.failure and "failure" not in written and not states.failure_if_present:
        found.append(
            (
                "states.failure",
                "is absent: a failed job escalates as unknown_state; list the provider's "
                "failure states, or write failure: [] if it has none",
            )
        )
    return found


def _shape_warnings(policy: ProviderPolicy, shape: Shape) -> list[tuple[str, str]]:
    written = policy.states.model_fields_set
    found = [
        (
            f"states.{kind}",
            f"is absent, and shape {shape.name} expects it: list the provider's {kind} "
            f"states, or write {kind}: [] if it has none",
        )
        for kind in shape.expects
        if kind != "failure" and kind not in written  # failure: _class_warnings
    ]
    vocabulary = _closest(policy, shape.vocabularies)
    if vocabulary is not None:
        for kind, value in vocabulary.values():
            if policy.state_class(value) is None:
                shown = json.dumps(value)
                found.append(
                    (
                        "states",
                        f"{shown} ({vocabulary.name}, documented as {kind}) is in no class: "
                        "an answer with it escalates as unknown_state",
                    )
                )
    return found


def _closest(policy: ProviderPolicy, vocabularies: tuple[Vocabulary, ...]) -> Vocabulary | None:
    """The vocabulary the policy's states are written in: the one it shares most with."""
    best, shared = None, 0
    for vocabulary in vocabularies:
        count = sum(policy.state_class(v) is not None for _, v in vocabulary.values())
        if count > shared:
            best, shared = vocabulary, count
    return best


def _result_warnings(policy: ProviderPolicy) -> list[tuple[str, str]]:
    route = policy.routes.result
    if route is None:
        return []
    required = {field.path for field in policy.states.required()}
    pointers = [
        name.removeprefix("final.")
        for name in placeholders(route.path)
        if name.startswith("final.")
    ]
    if pointers:
        return [
            (
                "states.success_requires",
                f"lacks {pointer}, which the result route reads: a success answer without "
                f"it is accepted and the result is answered not-ready; add {pointer} "
                "(with allow_null: true if the provider may leave it null)",
            )
            for pointer in pointers
            if pointer not in required
        ]
    if not required:
        return [
            (
                "states.success_requires",
                "is empty while a result route exists: a success answer is accepted without "
                "the field that points to the result; name it (allow_null: true if it may "
                "be null)",
            )
        ]
    return []

"""policies/openai-responses.yaml driven by the official ``openai`` SDK at its defaults
(only the base URL changed, the gateway token as its API key) through a real gateway,
against the pack's double of background Responses (gateway/demo/pack/openai_responses.py),
on the shipped policy's production schedule in virtual time. The SDK has no wait helper
for responses: the agent is the guide's own loop, ``responses.retrieve`` while the status
is queued or in_progress, without its sleep."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest
from virtual_time import Setup, assert_paced, held, pack_gateway, provider_keys, table

from conftest import AGENT_TOKEN, PROVIDER_KEY

PROVIDER = "openai-responses"
RUNNING = {"queued", "in_progress"}


def client(setup: Setup) -> openai.OpenAI:
    return openai.OpenAI(base_url=setup.url(PROVIDER, "/v1"), api_key=AGENT_TOKEN)


def background(setup: Setup, sdk: openai.OpenAI, script: list[dict[str, Any]]) -> Any:
    """Create a background response and retrieve it in a loop until it leaves queued and
    in_progress."""
    agent = setup.agent
    response: Any = sdk.responses.create(
        model="gpt-5",
        input="Write a long report about otters.",
        background=True,
        extra_body={"demo_script": script},
    )
    while response.status in RUNNING and agent.busy:
        try:
            response = sdk.responses.retrieve(response.id)
        except openai.APIError as problem:
            agent.caught(problem)
    return response


async def test_openai_sdk_waits_for_a_background_response(tmp_path: Path) -> None:
    """responses.create(background=True) and a naive responses.retrieve loop through five
    minutes of queued / in_progress end with the completed Response and its output_text,
    no exception, the provider polled within the shipped 2-second-based schedule."""
    script = [held("queued", 20), held("in_progress", 300), {"state": "completed"}]
    async with pack_gateway(tmp_path) as setup:
        sdk, agent = client(setup), setup.agent
        started = agent.clock.now
        response = await agent.run(lambda: background(setup, sdk, script))
        times = setup.polls(response.id)
        record = await setup.record(PROVIDER, response.id)
    loop = "naive responses.retrieve"
    table(PROVIDER, f"openai {openai.__version__}", loop, setup, len(times), started)
    assert agent.exceptions == []
    assert response.status == "completed" and response.output_text == "demo answer"
    assert record.outcome.value == "succeeded"
    assert_paced(PROVIDER, times, started, agent.clock.now)
    provider_keys(setup, "Authorization", f"Bearer {PROVIDER_KEY}")


@pytest.mark.parametrize(
    ("last", "outcome"),
    [("failed", "failed"), ("incomplete", "succeeded"), ("cancelled", "cancelled")],
)
async def test_every_terminal_status_of_a_response_ends_the_wait(
    tmp_path: Path, last: str, outcome: str
) -> None:
    """failed, incomplete (cut short at max_output_tokens: finished, with its partial
    output and no error, so a success as OpenAI's reference has it) and cancelled end the
    SDK's loop and the operation with an outcome, no escalation; the agent gets the
    provider's Response with its error or incomplete_details."""
    script = [held("in_progress", 60), {"state": last}]
    async with pack_gateway(tmp_path) as setup:
        sdk, agent = client(setup), setup.agent
        response = await agent.run(lambda: background(setup, sdk, script))
        record = await setup.record(PROVIDER, response.id)
    assert agent.exceptions == []
    assert response.status == last and record.outcome.value == outcome
    if last == "incomplete":
        assert response.incomplete_details.reason == "max_output_tokens"


async def test_a_response_without_background_is_answered_at_once(tmp_path: Path) -> None:
    """responses.create without background gets the completed Response in the create
    answer itself; nothing needs polling."""
    async with pack_gateway(tmp_path) as setup:
        sdk, agent = client(setup), setup.agent
        response: Any = await agent.run(
            lambda: sdk.responses.create(model="gpt-5", input="Say hello.")
        )
    assert response.status == "completed" and response.output_text == "demo answer"
    assert setup.polls(response.id) == []


async def test_operator_cancel_of_a_background_response(tmp_path: Path) -> None:
    """responses.cancel from the agent is refused (PermissionDeniedError); an operator's
    cancel reaches POST /v1/responses/{id}/cancel once and the SDK's loop then ends with
    the cancelled Response."""
    async with pack_gateway(tmp_path) as setup:
        sdk, agent = client(setup), setup.agent
        created: Any = await agent.run(
            lambda: sdk.responses.create(
                model="gpt-5",
                input="Think for a long time.",
                background=True,
                extra_body={"demo_script": [{"state": "in_progress"}]},
            )
        )
        with pytest.raises(openai.PermissionDeniedError):
            await agent.run(lambda: sdk.responses.cancel(created.id))
        assert await setup.operator_cancel(PROVIDER, created.id) == 200

        def until_done() -> Any:
            seen: Any = sdk.responses.retrieve(created.id)
            while seen.status in RUNNING and agent.busy:
                seen = sdk.responses.retrieve(created.id)
            return seen

        ended = await agent.run(until_done)
        record = await setup.record(PROVIDER, created.id)
    assert ended.status == "cancelled" and record.outcome.value == "cancelled"
    assert [(e["api"], e["path"]) for e in setup.calls("cancel")] == [
        (PROVIDER, f"/v1/responses/{created.id}/cancel")
    ]

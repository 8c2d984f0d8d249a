"""Veo's long-running operations through google-operations, driven by the real
``google-genai`` client at its default settings (only its base URL changed, the gateway
token as its API key): ``client.models.generate_videos`` and the
``client.operations.get`` loop of the Veo guide, against the demo provider's Veo paths
(gateway/demo/pack/veo.py), on virtual time with the policy's schedule.

The shipped google-operations policy keeps its submit route
(``/v1/projects/{project}/locations/{location}/jobs``): a policy has exactly one, and an
``also`` path form must name the same placeholders and is sent to the same provider path,
so Veo's ``models/{model}:predictLongRunning`` cannot be added beside it. This test gives
the policy Veo's submit route and the Gemini API's key header (``x-goog-api-key``, where
google-genai puts it) and keeps everything else as shipped: ``{job_id*}`` operation names,
``done`` / ``error`` / ``response``, replayed early calls. It shows what google-operations
serves of Veo once a policy may hold that second submit route (docs/providers.md). The
video itself is downloaded from the Files API (``files.download``), which the policy has
no route for (the URL in the answer names the file by a URI, not an id)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cloud_agents import Setup, assert_paced, gateway, phases, polls_at, row
from google import genai
from google.genai import errors, types

from gateway.demo.pack.veo import FAMILY

from conftest import AGENT_TOKEN, PROVIDER_KEY

PROVIDER = "google-operations"
VEO = {
    PROVIDER: {
        "credential": {"query": None, "header": "x-goog-api-key"},
        "routes": {
            "submit": {
                "path": "/v1beta/models/{model}:predictLongRunning",
                "also": ["/v1/models/{model}:predictLongRunning"],
            },
            "status": {"path": "/v1beta/{job_id*}", "also": ["/v1/{job_id*}"]},
            "cancel": None,  # the Gemini API documents no cancel of a Veo operation
        },
    }
}


def gemini(setup: Setup) -> genai.Client:
    options = types.HttpOptions(base_url=f"{setup.base}/p/{PROVIDER}")
    return genai.Client(api_key=AGENT_TOKEN, http_options=options)


def guide_loop(setup: Setup, client: genai.Client) -> Any:
    """The Veo guide's loop without its sleep: generate, then get until done."""
    agent = setup.agent
    operation = client.models.generate_videos(
        model="veo-3.0-generate-001", prompt="A lighthouse at dawn, waves below"
    )
    while not operation.done and not agent.busy:
        try:
            operation = client.operations.get(operation)
        except errors.APIError as error:
            agent.caught(error)
    return operation


async def test_veo_guide_loop_through_google_operations(tmp_path: Path) -> None:
    """generate_videos and a naive operations.get loop at google-genai's defaults see a
    six-minute Veo operation done with its video's URI, no exception, the provider polled
    on v1beta no sooner than the schedule allows and sent the gateway's key only."""
    script = phases("running", last="done", each=360)
    changes = VEO
    async with gateway(tmp_path, scripts={FAMILY.name: script}, policy_changes=changes) as setup:
        client, agent = gemini(setup), setup.agent
        started = agent.clock.now
        operation = await agent.run(lambda: guide_loop(setup, client))
        record = await setup.record(PROVIDER, str(operation.name))
        times = polls_at(setup.demo, str(operation.name))
        polling = setup.polling(PROVIDER)
        elapsed = agent.clock.now - started
    row(PROVIDER, "google-genai (Veo)", "naive operations.get", agent, len(times), elapsed)
    assert agent.exceptions == []
    assert operation.done and record.outcome.value == "succeeded"
    videos = operation.response.generated_videos
    assert videos[0].video.uri.startswith("https://generativelanguage.googleapis.com/")
    assert_paced(times, started, polling)
    sent = [e for e in setup.demo.log if e["job_id"] == operation.name]
    assert all(e["path"].startswith("/v1beta/models/veo-3.0-generate-001/") for e in sent)
    assert all(e["headers"]["x-goog-api-key"] == PROVIDER_KEY for e in sent)
    assert AGENT_TOKEN not in str([e["headers"] for e in setup.demo.log])

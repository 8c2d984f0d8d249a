"""policies/elevenlabs-dubbing.yaml driven by the official ``elevenlabs`` SDK at its defaults
(only ``base_url`` changed, the gateway token as its API key, which the SDK sends in
``xi-api-key``), on virtual time, against the demo provider's ElevenLabs double
(gateway/demo/pack/elevenlabs_dubbing.py), with the policy's schedule as shipped:
``dubbing.create`` then a naive ``dubbing.get`` loop (the SDK has no waiter for dubbing).
The SDK's create is a multipart form without room for an extra field, so the double's jobs
follow ``default_scripts``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from elevenlabs.client import ElevenLabs
from elevenlabs.core import ApiError
from paced import assert_paced, shipped_polling
from test_sdk_agents import MAX_CALLS, Setup, gateway, polls_at, table

from gateway.demo.pack.elevenlabs_dubbing import AUDIO
from gateway.flow.runtime import RUNTIME

from conftest import AGENT_TOKEN, PROVIDER_KEY

PROVIDER = "elevenlabs-dubbing"
SOURCE = "https://example.com/talk.mp4"
SCRIPT = [{"state": "dubbing", "until": 240}, {"state": "dubbed"}]


def client(setup: Setup) -> ElevenLabs:
    return ElevenLabs(api_key=AGENT_TOKEN, base_url=f"{setup.base}/p/{PROVIDER}")


def dub_until_done(el: ElevenLabs, setup: Setup) -> Any:
    """What an agent does: create the dub, then ask again at once until it is done."""
    agent = setup.agent
    created = el.dubbing.create(source_url=SOURCE, target_lang="es", source_lang="en")
    metadata = el.dubbing.get(created.dubbing_id)
    while metadata.status == "dubbing" and len(agent.calls) < MAX_CALLS:
        try:
            metadata = el.dubbing.get(created.dubbing_id)
        except ApiError as error:
            agent.caught(error)
    return metadata


def provider_headers_ok(setup: Setup) -> None:
    for entry in setup.demo.log:
        assert entry["headers"]["xi-api-key"] == PROVIDER_KEY
        assert AGENT_TOKEN not in str(entry["headers"])


async def test_elevenlabs_naive_get_loop_at_default_settings(tmp_path: Path) -> None:
    """``dubbing.create(source_url=..., target_lang="es")`` then a naive ``dubbing.get``
    loop ends dubbed with no exception (the SDK's own 429 retries included), the provider
    polled on the policy's schedule."""
    async with gateway(tmp_path) as setup:
        setup.demo.default_scripts["elevenlabs-dubbing"] = SCRIPT
        el, agent = client(setup), setup.agent
        started = agent.clock.now
        metadata = await agent.run(lambda: dub_until_done(el, setup))
        times = polls_at(setup.demo, metadata.dubbing_id)
    table("elevenlabs 2.78.0", "dubbing.create + naive dubbing.get", agent, len(times))
    assert agent.exceptions == []
    assert metadata.status == "dubbed" and metadata.target_languages == ["es"]
    assert_paced(times, started, shipped_polling(PROVIDER))
    assert len(agent.calls) > 5 * len(times)
    provider_headers_ok(setup)


async def test_elevenlabs_failed_dub_ends_the_operation_failed(tmp_path: Path) -> None:
    """A dub that fails ends the operation failed with its error kept; asking again is
    answered from the record."""
    async with gateway(tmp_path) as setup:
        setup.demo.default_scripts["elevenlabs-dubbing"] = [{"state": "failed"}]
        el = client(setup)
        metadata = await setup.agent.run(lambda: dub_until_done(el, setup))
        again = await setup.agent.run(lambda: el.dubbing.get(metadata.dubbing_id))
        store = setup.client.app[RUNTIME].store
        record = await store.find("team-a", PROVIDER, metadata.dubbing_id)
        polls = polls_at(setup.demo, metadata.dubbing_id)
    assert metadata.status == "failed" and again.error == metadata.error
    assert record.outcome.value == "failed" and len(polls) == record.status_requests_used


async def test_elevenlabs_dubbed_audio_comes_through_the_result_route(tmp_path: Path) -> None:
    """``dubbing.audio.get(dubbing_id, "es")`` downloads the dubbed file through the
    gateway once the dub is done."""
    async with gateway(tmp_path) as setup:
        setup.demo.default_scripts["elevenlabs-dubbing"] = SCRIPT
        el = client(setup)

        def work() -> bytes:
            metadata = dub_until_done(el, setup)
            return b"".join(el.dubbing.audio.get(metadata.dubbing_id, "es"))

        audio = await setup.agent.run(work)
    assert audio == AUDIO

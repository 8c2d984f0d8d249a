"""policies/assemblyai.yaml driven by the official ``assemblyai`` SDK at its defaults (only
``settings.base_url`` changed, the gateway token as ``settings.api_key``, which the SDK
sends bare in ``Authorization``), on virtual time, against the demo provider's AssemblyAI
double (gateway/demo/pack/assemblyai.py), with the policy's schedule as shipped:
``Transcriber().transcribe(...)``, which polls by itself every 3 s, and ``submit`` with a
naive ``Transcript.get_by_id`` loop. The SDK's request body takes no extra field, so the
double's jobs follow ``default_scripts``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import assemblyai as aai
import pytest
from paced import assert_paced, shipped_polling
from test_sdk_agents import MAX_CALLS, Setup, gateway, polls_at, table

from gateway.demo.pack.assemblyai import TEXT
from gateway.flow.runtime import RUNTIME

from conftest import AGENT_TOKEN, PROVIDER_KEY

PROVIDER = "assemblyai"
AUDIO = "https://assembly.ai/wildfires.mp3"
SCRIPT = [
    {"state": "queued", "until": 20},
    {"state": "processing", "until": 90},
    {"state": "completed"},
]


@pytest.fixture
def sdk_settings(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The SDK's global settings, restored after the test; its default client rebuilt
    for the test and closed after it."""
    monkeypatch.setattr(aai.Client, "_default", None)
    for name in ("api_key", "base_url"):
        monkeypatch.setattr(aai.settings, name, getattr(aai.settings, name))
    yield aai.settings
    if aai.Client._default is not None:
        aai.Client._default.http_client.close()


def point(settings: Any, setup: Setup) -> None:
    settings.api_key = AGENT_TOKEN
    settings.base_url = f"{setup.base}/p/{PROVIDER}"


def provider_headers_ok(setup: Setup) -> None:
    for entry in setup.demo.log:
        assert entry["headers"]["Authorization"] == PROVIDER_KEY
        assert AGENT_TOKEN not in str(entry["headers"])


async def test_assemblyai_transcribe_at_default_settings(tmp_path: Path, sdk_settings: Any) -> None:
    """``Transcriber().transcribe(url)`` returns the completed transcript's text, no
    exception, its 3 s polls answered by the gateway, the provider polled on the policy's
    schedule."""
    async with gateway(tmp_path) as setup:
        setup.demo.default_scripts["assemblyai"] = SCRIPT
        point(sdk_settings, setup)
        agent = setup.agent
        started = agent.clock.now
        transcript = await agent.run(lambda: aai.Transcriber().transcribe(AUDIO))
        times = polls_at(setup.demo, transcript.id)
    table("assemblyai 1.8.2", "Transcriber().transcribe", agent, len(times))
    assert transcript.status == aai.TranscriptStatus.completed and transcript.text == TEXT
    assert_paced(times, started, shipped_polling(PROVIDER))
    assert len(agent.calls) > len(times) + 1
    provider_headers_ok(setup)


async def test_assemblyai_local_file_is_uploaded_then_transcribed(
    tmp_path: Path, sdk_settings: Any
) -> None:
    """``transcribe(bytes)`` uploads the audio through the passthrough (POST /v2/upload),
    then transcribes the URL the upload answered."""
    async with gateway(tmp_path) as setup:
        setup.demo.default_scripts["assemblyai"] = SCRIPT
        point(sdk_settings, setup)
        audio = b"RIFF\x24\x00\x00\x00WAVEfmt demo audio"
        transcript = await setup.agent.run(lambda: aai.Transcriber().transcribe(audio))
        uploads = [e for e in setup.demo.log if e["kind"] == "file"]
    assert transcript.status == aai.TranscriptStatus.completed
    assert len(uploads) == 1 and audio in setup.demo.files.values()
    assert transcript.json_response["audio_url"].startswith("https://cdn.assemblyai.com/upload/")
    provider_headers_ok(setup)


async def test_assemblyai_naive_get_by_id_loop_at_default_settings(
    tmp_path: Path, sdk_settings: Any
) -> None:
    """``Transcriber().submit(url)`` then a naive ``Transcript.get_by_id`` loop with no
    sleep ends completed with no exception, the provider polled on schedule."""
    async with gateway(tmp_path) as setup:
        setup.demo.default_scripts["assemblyai"] = SCRIPT
        point(sdk_settings, setup)
        agent = setup.agent
        started = agent.clock.now

        def work() -> Any:
            transcript = aai.Transcriber().submit(AUDIO)
            while transcript.status not in ("completed", "error"):
                if len(agent.calls) >= MAX_CALLS:
                    break
                try:
                    transcript = aai.Transcript.get_by_id(transcript.id)
                except aai.types.TranscriptError as error:
                    agent.caught(error)
            return transcript

        transcript = await agent.run(work)
        times = polls_at(setup.demo, transcript.id)
    table("assemblyai 1.8.2", "naive Transcript.get_by_id", agent, len(times))
    assert agent.exceptions == []
    assert transcript.status == aai.TranscriptStatus.completed and transcript.text == TEXT
    assert_paced(times, started, shipped_polling(PROVIDER))


async def test_assemblyai_error_ends_the_operation_failed(
    tmp_path: Path, sdk_settings: Any
) -> None:
    """A transcript in ``error`` ends the operation failed, with its error kept; the SDK
    returns it (it does not raise), and asking again reaches the record, not AssemblyAI."""
    async with gateway(tmp_path) as setup:
        setup.demo.default_scripts["assemblyai"] = [{"state": "queued"}, {"state": "error"}]
        point(sdk_settings, setup)
        transcript = await setup.agent.run(lambda: aai.Transcriber().transcribe(AUDIO))
        again = await setup.agent.run(lambda: aai.Transcript.get_by_id(transcript.id))
        record = await setup.client.app[RUNTIME].store.find("team-a", PROVIDER, transcript.id)
        polls = polls_at(setup.demo, transcript.id)
    assert transcript.status == aai.TranscriptStatus.error
    assert again.error == transcript.error and "scripted" in (transcript.error or "")
    assert record.outcome.value == "failed" and len(polls) == record.status_requests_used

"""SPEC 22: agents authenticate the SDK's own way. The gateway token is accepted in the
header the policy's credential sets, with the credential's scheme word, so an SDK needs only
its API key and base URL changed; it is never forwarded (the credential replaces it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conftest import AGENT_TOKEN, OTHER_TOKEN, PROVIDER_KEY, FakeClock
from doubles import Answer, Double, Seen, gateway, serve

# (credential header, credential value, what the agent sends in that header)
FORMS = [
    ("x-api-key", "${DEMO_API_KEY}", "{token}"),  # anthropic-style, ElevenLabs' xi-api-key
    ("x-goog-api-key", "${DEMO_API_KEY}", "{token}"),  # google-genai
    ("Authorization", "Key ${DEMO_API_KEY}", "Key {token}"),  # fal
    ("Authorization", "Token ${DEMO_API_KEY}", "Token {token}"),  # Replicate, older SDKs
    ("Authorization", "${DEMO_API_KEY}", "{token}"),  # AssemblyAI: the bare key
]


def policy(upstream: str, header: str, value: str) -> dict[str, Any]:
    return {
        "provider": "keyed",
        "shape": "openai-job",
        "upstream": upstream,
        "credential": {"header": header, "value": value},
        "routes": {"submit": {"path": "/v1/jobs"}, "status": {"path": "/v1/jobs/{job_id}"}},
        "states": {
            "pending": ["queued"],
            "success": ["done"],
            "failure": ["failed"],
            "cancelled": [],
            "expired": [],
        },
    }


def answer(seen: Seen) -> Answer:
    return 200, {"id": "j1", "status": "queued"}, {}


def leaked(seen: Seen, token: str) -> bool:
    return (
        token in seen.path
        or token.encode() in seen.body
        or any(token in value for value in seen.headers.values())
    )


@pytest.mark.parametrize(("header", "value", "sent"), FORMS)
async def test_the_token_where_the_sdk_puts_its_key(
    tmp_path: Path, clock: FakeClock, header: str, value: str, sent: str
) -> None:
    """The gateway token in the credential's own header and form authenticates submit and
    status calls; the provider gets the gateway's credential in that header and never the
    agent's token; a wrong token in that form, and the form with its scheme word missing
    or changed, are 401."""
    double = Double(answer)
    server = await serve(double)
    upstream = str(server.make_url("")).rstrip("/")
    client = await gateway(tmp_path, clock, upstream, {"keyed": policy(upstream, header, value)})
    try:
        mine = {header: sent.format(token=AGENT_TOKEN)}
        submitted = await client.post("/p/keyed/v1/jobs", json={"n": 1}, headers=mine)
        assert submitted.status == 200, await submitted.text()
        clock.advance(60)
        polled = await client.get("/p/keyed/v1/jobs/j1", headers=mine)
        assert polled.status == 200, await polled.text()
        assert len(double.log) == 2
        for seen in double.log:
            assert seen.headers[header] == value.replace("${DEMO_API_KEY}", PROVIDER_KEY)
            assert not leaked(seen, AGENT_TOKEN)
        wrong = {header: sent.format(token="not-a-token-of-anyone")}
        refused = await client.post("/p/keyed/v1/jobs", json={}, headers=wrong)
        assert refused.status == 401
        assert header in (await refused.json())["detail"]
        scheme = value.partition(" ")[0] if " " in value else None
        if scheme is not None:  # the token without its scheme word, or under another one
            for form in (AGENT_TOKEN, f"Basic {AGENT_TOKEN}"):
                missing = await client.get("/p/keyed/v1/jobs/j1", headers={header: form})
                assert missing.status == 401
        assert len(double.log) == 2
    finally:
        await client.close()
        await server.close()


async def test_one_policys_key_form_is_no_key_for_another(tmp_path: Path, clock: FakeClock) -> None:
    """A token in x-api-key is accepted only by policies whose credential is x-api-key: the
    shipped Bearer policies answer 401, and the usual forms still work for every policy."""
    double = Double(answer)
    server = await serve(double)
    upstream = str(server.make_url("")).rstrip("/")
    keyed = policy(upstream, "x-api-key", "${DEMO_API_KEY}")
    client = await gateway(tmp_path, clock, upstream, {"keyed": keyed})
    try:
        other = await client.get(
            "/p/openai-batch/v1/batches/b1", headers={"x-api-key": AGENT_TOKEN}
        )
        assert other.status == 401
        for usual in (
            {"Authorization": f"Bearer {AGENT_TOKEN}"},
            {"Statusgate-Token": AGENT_TOKEN},
        ):
            done = await client.post("/p/keyed/v1/jobs", json={}, headers=usual)
            assert done.status == 200, await done.text()
        team_b = await client.post("/p/keyed/v1/jobs", json={}, headers={"x-api-key": OTHER_TOKEN})
        assert team_b.status == 403  # a known token of an account not allowed this provider
        assert all(not leaked(seen, OTHER_TOKEN) for seen in double.log)
    finally:
        await client.close()
        await server.close()

"""Agent keys through the operator API (SPEC 25): made, listed, revoked, expired and
rotated by an admin; used by agents like a config account's token, limited to the key's
providers; audited without the token; quotas answered 429 quota-exceeded with nothing
forwarded."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from gateway.settings.units import rfc3339

from conftest import OPERATOR_TOKEN, Harness, sha

VIEWER = "operator-token-victor"
OPERATORS = [
    {"id": "alice", "token_sha256": sha(OPERATOR_TOKEN)},
    {"id": "victor", "token_sha256": sha(VIEWER), "role": "viewer"},
]
ADMIN = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}


@pytest.fixture
async def gateway(make_harness: Any) -> Harness:
    harness: Harness = await make_harness(config_changes={"operators": OPERATORS})
    return harness


async def make_key(harness: Harness, **body: Any) -> dict[str, Any]:
    body.setdefault("account", "team-k")
    body.setdefault("providers", ["demo-jobs"])
    made = await harness.client.post("/admin/keys", json=body, headers=ADMIN)
    assert made.status == 201, await made.text()
    assert made.headers["Cache-Control"] == "no-store"
    answer: dict[str, Any] = await made.json()
    return answer


async def poll_due(harness: Harness, job: str, token: str) -> Any:
    """Poll once the gateway permits it (the key's account is team-k)."""
    record = await harness.record(job, account="team-k")
    harness.clock.now = max(harness.clock.now, record.next_poll_at)
    return await harness.poll(job, token=token)


def submits(harness: Harness) -> int:
    """Submissions the demo provider received."""
    return sum(1 for entry in harness.provider.log if entry["method"] == "POST")


async def test_a_key_is_made_used_listed_and_revoked(gateway: Harness) -> None:
    """An admin makes a key: 201 with the token, once. The agent submits and polls with it
    under the key's account, only to the key's providers. The list shows the key without
    token or digest. Revoked (204), the token is refused at once; the audit log has
    key_created and key_revoked with the key's id and never the token."""
    made = await make_key(gateway, quotas={"max_active_operations": 5})
    token = made["token"]
    assert token.startswith("sgk_") and made["id"].startswith("key_")
    assert (made["account"], made["providers"]) == ("team-k", ["demo-jobs"])
    assert made["expires_at"] is None
    assert made["quotas"] == {"max_active_operations": 5, "submits_per_hour": None}
    response = await gateway.submit([{"state": "running"}], token=token)
    assert response.status in (200, 201, 202), await response.text()
    job = (await response.json())["id"]
    record = await gateway.record(job, account="team-k")
    assert record.account == "team-k"
    assert (await poll_due(gateway, job, token)).status == 200
    other = await gateway.submit(provider="openai-batch", path="/v1/batches", token=token)
    assert other.status == 403 and (await other.json())["type"] == "/problems/forbidden"

    listed = await gateway.client.get("/admin/keys", headers=ADMIN)
    text = await listed.text()
    assert listed.status == 200 and token not in text and sha(token) not in text
    (shown,) = (await listed.json())["keys"]
    assert shown["id"] == made["id"] and shown["created_by"] == "alice"
    assert shown["expired"] is False and "token" not in shown

    revoked = await gateway.client.delete(f"/admin/keys/{made['id']}", headers=ADMIN)
    assert revoked.status == 204
    refused = await gateway.poll(job, token=token)
    assert refused.status == 401 and (await refused.json())["type"] == "/problems/unauthenticated"
    again = await gateway.client.delete(f"/admin/keys/{made['id']}", headers=ADMIN)
    assert again.status == 404 and (await again.json())["type"] == "/problems/unknown-key"
    assert (await (await gateway.client.get("/admin/keys", headers=ADMIN)).json())["keys"] == []

    log = gateway.audit_path.read_text()
    assert token not in log and sha(token) not in log
    events = [line for line in gateway.audit_lines() if line["event"].startswith("key_")]
    assert [(e["event"], e["key_id"], e["actor"]) for e in events] == [
        ("key_created", made["id"], "alice"),
        ("key_revoked", made["id"], "alice"),
    ]


async def test_an_expired_key_is_refused_like_an_unknown_one(gateway: Harness) -> None:
    """A key with expires_at works until then, and is 401 unauthenticated after it (the
    gateway's clock), listed as expired."""
    expires = rfc3339(gateway.clock.now + 60)
    made = await make_key(gateway, expires_at=expires)
    assert made["expires_at"] == expires
    response = await gateway.submit([{"state": "running"}], token=made["token"])
    assert response.status in (200, 201, 202), await response.text()
    job = (await response.json())["id"]
    gateway.clock.advance(61)
    refused = await gateway.poll(job, token=made["token"])
    assert refused.status == 401 and (await refused.json())["type"] == "/problems/unauthenticated"
    (shown,) = (await (await gateway.client.get("/admin/keys", headers=ADMIN)).json())["keys"]
    assert shown["expired"] is True


async def test_only_an_admin_manages_keys(gateway: Harness) -> None:
    """A viewer gets 403 forbidden-role (required_role admin) on every keys route; an agent
    key is no operator token."""
    viewer = {"Authorization": f"Bearer {VIEWER}"}
    made = await make_key(gateway)
    for method, path in (
        ("GET", "/admin/keys"),
        ("POST", "/admin/keys"),
        ("DELETE", f"/admin/keys/{made['id']}"),
        ("POST", f"/admin/keys/{made['id']}/rotate"),
    ):
        answer = await gateway.client.request(
            method, path, json={"account": "x", "providers": ["*"]}, headers=viewer
        )
        body = await answer.json()
        assert answer.status == 403, (method, path)
        assert (body["type"], body["required_role"]) == ("/problems/forbidden-role", "admin")
    as_agent = {"Authorization": f"Bearer {made['token']}"}
    answer = await gateway.client.get("/admin/keys", headers=as_agent)
    assert answer.status == 403 and (await answer.json())["type"] == "/problems/forbidden"


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ({"providers": ["demo-jobs"]}, "account must be"),
        ({"account": "a", "providers": "demo-jobs"}, "providers must be"),
        ({"account": "a", "providers": ["nope"]}, "no policy is loaded for 'nope'"),
        ({"account": "a", "providers": ["*"], "expires_at": "tomorrow"}, "RFC 3339"),
        ({"account": "a", "providers": ["*"], "expires_at": "2001-01-01T00:00:00Z"}, "past"),
        ({"account": "a", "providers": ["*"], "quotas": {"submits_per_hour": 0}}, "quotas."),
        ({"account": "a", "providers": ["*"], "quotas": {"per_day": 3}}, "quotas.per_day"),
        (  # more than every store counts (PostgreSQL's were store errors, every submit 503)
            {"account": "a", "providers": ["*"], "quotas": {"submits_per_hour": 2**31}},
            "quotas.submits_per_hour",
        ),
        ({"account": "a", "providers": ["*"], "token": "mine"}, "unknown member 'token'"),
    ],
)
async def test_a_bad_key_request_is_400_saying_what(
    gateway: Harness, body: dict[str, Any], said: str
) -> None:
    """Each mistake in a key request is 400 invalid-request naming the member; no key."""
    answer = await gateway.client.post("/admin/keys", json=body, headers=ADMIN)
    assert answer.status == 400
    assert said in (await answer.json())["detail"]
    assert (await (await gateway.client.get("/admin/keys", headers=ADMIN)).json())["keys"] == []


async def test_rotation_makes_a_new_token_and_revokes_the_old(gateway: Harness) -> None:
    """Rotating by hand (make a new key, move the agent, revoke the old) and with
    /rotate (same account, providers, expiry and quotas; a new id and token; the old one
    refused at once) both leave exactly one working token."""
    first = await make_key(gateway, quotas={"submits_per_hour": 50})
    second = await make_key(gateway, quotas={"submits_per_hour": 50})
    await gateway.client.delete(f"/admin/keys/{first['id']}", headers=ADMIN)
    assert (await gateway.submit(token=first["token"], key="r1")).status == 401
    assert (await gateway.submit(token=second["token"], key="r2")).status in (200, 201, 202)

    rotated = await gateway.client.post(f"/admin/keys/{second['id']}/rotate", headers=ADMIN)
    assert rotated.status == 201
    third = await rotated.json()
    assert third["id"] != second["id"] and third["token"] != second["token"]
    same = ("account", "providers", "expires_at", "quotas")
    assert {k: third[k] for k in same} == {k: second[k] for k in same}
    assert (await gateway.submit(token=second["token"], key="r3")).status == 401
    assert (await gateway.submit(token=third["token"], key="r4")).status in (200, 201, 202)
    listed = (await (await gateway.client.get("/admin/keys", headers=ADMIN)).json())["keys"]
    assert [k["id"] for k in listed] == [third["id"]]
    missing = await gateway.client.post("/admin/keys/key_nope/rotate", headers=ADMIN)
    assert missing.status == 404


async def test_max_active_operations_refuses_with_nothing_forwarded(gateway: Harness) -> None:
    """With max_active_operations 1, a second submission while the first operation is
    pending is 429 quota-exceeded with Retry-After and the provider sees nothing; once the
    first operation has ended, the same submission (its idempotency key free again) goes."""
    made = await make_key(gateway, quotas={"max_active_operations": 1})
    token = made["token"]
    first = await gateway.submit([{"state": "running"}, {"state": "succeeded"}], token=token)
    job = (await first.json())["id"]
    sent = submits(gateway)
    refused = await gateway.submit(token=token, key="second")
    body = await refused.json()
    assert refused.status == 429 and body["type"] == "/problems/quota-exceeded"
    assert "max_active_operations 1" in body["detail"]
    assert int(refused.headers["Retry-After"]) > 0
    assert submits(gateway) == sent
    assert (await poll_due(gateway, job, token)).status == 200
    done = await poll_due(gateway, job, token)
    assert done.status == 200 and (await gateway.record(job, account="team-k")).outcome.terminal
    again = await gateway.submit([{"state": "running"}], token=token, key="second")  # free
    assert again.status in (200, 201, 202), await again.text()
    assert submits(gateway) == sent + 1


async def test_submits_per_hour_slides_and_binds_config_accounts_too(
    make_harness: Any,
) -> None:
    """A config account's quotas hold as a key's do: with submits_per_hour 2 the third
    submission within the hour is 429 with Retry-After until the first is an hour old, and
    nothing reaches the provider; an hour later a submission goes."""
    accounts = [
        {"id": "team-a", "token_sha256": sha("agent-token-team-a"), "providers": ["*"]},
        {
            "id": "team-q",
            "token_sha256": sha("agent-token-team-q"),
            "quotas": {"submits_per_hour": 2},
        },
    ]
    harness: Harness = await make_harness(config_changes={"accounts": accounts})
    token = "agent-token-team-q"
    for n in range(2):
        answer = await harness.submit([{"state": "running"}], token=token, key=f"s{n}")
        assert answer.status in (200, 201, 202)
        harness.clock.advance(10)
    sent = submits(harness)
    refused = await harness.submit(token=token, key="s2")
    assert refused.status == 429 and (await refused.json())["type"] == "/problems/quota-exceeded"
    assert 3570 <= int(refused.headers["Retry-After"]) <= 3581
    assert submits(harness) == sent
    unlimited = await harness.submit(key="other-account")  # team-a: no quotas
    assert unlimited.status in (200, 201, 202)
    harness.clock.advance(3581)
    assert (await harness.submit(token=token, key="s3")).status in (200, 201, 202)


async def test_key_answers_match_the_openapi_document(gateway: Harness) -> None:
    """A made key, a rotated one and the list validate against /openapi.json's schemas."""
    document = await (await gateway.client.get("/openapi.json")).json()

    def check(name: str, value: Any) -> None:
        schema = {**document, "$ref": f"#/components/schemas/{name}"}
        jsonschema.Draft202012Validator(schema).validate(value)

    made = await make_key(gateway, expires_at=rfc3339(gateway.clock.now + 60))
    check("NewAgentKey", made)
    rotated = await gateway.client.post(f"/admin/keys/{made['id']}/rotate", headers=ADMIN)
    check("NewAgentKey", await rotated.json())
    check("KeyList", await (await gateway.client.get("/admin/keys", headers=ADMIN)).json())
    check("KeyRequest", {"account": "a", "providers": ["*"], "quotas": {"submits_per_hour": 1}})


async def test_a_submission_the_provider_refused_gives_its_place_back(gateway: Harness) -> None:
    """With max_active_operations 1, a submission the provider answers 400 opens no
    operation and frees its place at once: the next submission is forwarded."""
    made = await make_key(gateway, quotas={"max_active_operations": 1})
    refused = await gateway.submit(token=made["token"], key="bad", submit={"http": 400})
    assert refused.status == 400
    accepted = await gateway.submit([{"state": "running"}], token=made["token"], key="good")
    assert accepted.status in (200, 201, 202), await accepted.text()


async def test_a_rotated_key_keeps_counting_against_the_same_quotas(gateway: Harness) -> None:
    """Rotation does not reset a key's quota counts: with max_active_operations 2 and two
    operations pending under the old token, the new token's third submission is 429
    quota-exceeded with nothing forwarded; a second rotation still counts them too."""
    made = await make_key(gateway, quotas={"max_active_operations": 2})
    for n in (1, 2):
        opened = await gateway.submit([{"state": "running"}], token=made["token"], key=f"o{n}")
        assert opened.status in (200, 201, 202), await opened.text()
    sent = submits(gateway)
    for _ in range(2):
        rotated = await gateway.client.post(f"/admin/keys/{made['id']}/rotate", headers=ADMIN)
        assert rotated.status == 201
        made = await rotated.json()
        refused = await gateway.submit([{"state": "running"}], token=made["token"], key="o3")
        body = await refused.json()
        assert refused.status == 429 and body["type"] == "/problems/quota-exceeded", body
        assert submits(gateway) == sent

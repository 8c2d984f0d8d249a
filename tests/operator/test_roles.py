"""Operator roles with static tokens (SPEC 25), no single sign-on: viewer reads, decider also
decides escalations, admin also reloads; an operator without a role is an admin, as every
config written before roles existed expects."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway import ConfigError
from gateway.core.problems import PROBLEMS
from gateway.settings.config import load_settings

from conftest import OPERATOR_TOKEN, PROVIDER_ENV, Harness, sha, write_config

VIEWER, DECIDER = "operator-token-victor", "operator-token-dora"
OPERATORS = [
    {"id": "alice", "token_sha256": sha(OPERATOR_TOKEN)},  # no role: admin
    {"id": "victor", "token_sha256": sha(VIEWER), "role": "viewer"},
    {"id": "dora", "token_sha256": [sha(DECIDER)], "role": "decider"},
]


@pytest.fixture
async def roles(make_harness: Any) -> Harness:
    harness: Harness = await make_harness(config_changes={"operators": OPERATORS})
    return harness


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def escalate(harness: Harness, key: str) -> str:
    response = await harness.submit([{"state": "running"}], key=key)
    job, operation = (await response.json())["id"], response.headers["Statusgate-Operation"]
    harness.clock.advance(601)
    assert (await harness.poll(job)).status == 409
    return str(operation)


async def test_a_viewer_reads_everything_and_decides_nothing(roles: Harness) -> None:
    """A viewer lists operations and escalations and shows one with its story; every
    decision is 403 forbidden-role (required_role decider, role viewer, X-Should-Retry:
    false) and leaves the record and the audit log as they were."""
    operation = await escalate(roles, "k1")
    for path in ("/admin/operations", "/admin/escalations", f"/admin/operations/{operation}"):
        assert (await roles.client.get(path, headers=bearer(VIEWER))).status == 200, path
    lines = len(roles.audit_lines())
    for action in ("extend", "cancel", "abandon", "resume"):
        answer = await roles.client.post(
            f"/admin/operations/{operation}/{action}",
            json={"time": "1m", "reason": "no"},
            headers=bearer(VIEWER),
        )
        assert answer.status == 403, action
        assert answer.headers["X-Should-Retry"] == "false"
        body = await answer.json()
        assert body["type"] == "/problems/forbidden-role"
        assert (body["title"], body["status"]) == ("Forbidden for this role", 403)
        assert (body["required_role"], body["role"]) == ("decider", "viewer")
        assert body["error"]["code"] == "forbidden-role"
    assert len(roles.audit_lines()) == lines
    shown = await roles.client.get(f"/admin/operations/{operation}", headers=bearer(VIEWER))
    assert (await shown.json())["record"]["outcome"] == "escalated"


async def test_a_decider_decides_and_may_not_reload(roles: Harness) -> None:
    """A decider abandons an escalation (audited with their id) but a reload is 403
    forbidden-role naming admin; /admin/me tells each operator their role."""
    operation = await escalate(roles, "k1")
    done = await roles.client.post(
        f"/admin/operations/{operation}/abandon", json={"reason": "gone"}, headers=bearer(DECIDER)
    )
    assert done.status == 200, await done.text()
    line = next(x for x in roles.audit_lines() if x["event"] == "abandoned")
    assert line["actor"] == "dora"
    reload = await roles.client.post("/admin/reload", headers=bearer(DECIDER))
    assert reload.status == 403
    assert (await reload.json())["required_role"] == "admin"
    expected = {OPERATOR_TOKEN: ("alice", "admin"), VIEWER: ("victor", "viewer")}
    expected[DECIDER] = ("dora", "decider")
    for token, (name, role) in expected.items():
        me = await (await roles.client.get("/admin/me", headers=bearer(token))).json()
        assert (me["id"], me["role"], me["via"], me["expires_at"]) == (name, role, "token", None)
        assert me["may"]["decide"] is (role != "viewer")
        assert me["may"]["reload"] is (role == "admin")


async def test_an_operator_without_a_role_is_an_admin(
    roles: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The role defaults to admin: a config from before roles keeps reloading and deciding."""
    for name, value in PROVIDER_ENV.items():
        monkeypatch.setenv(name, value)
    reload = await roles.client.post("/admin/reload", headers=bearer(OPERATOR_TOKEN))
    assert reload.status == 200, await reload.text()
    assert (await reload.json())["actor"] == "alice"


async def test_forbidden_role_is_explained_and_agents_stay_forbidden(roles: Harness) -> None:
    """/problems/forbidden-role explains the roles; an agent token is still 403 forbidden
    and no token 401, before any role is looked at."""
    explained = await roles.client.get("/problems/forbidden-role")
    assert explained.status == 200
    text = await explained.text()
    assert text.startswith("Forbidden for this role (403)")
    for word in ("viewer", "decider", "admin", "operators[].role", "oidc.roles"):
        assert word in text
    assert PROBLEMS["forbidden-role"].retry is False
    agent = await roles.client.get("/admin/me", headers=roles.auth())
    assert (await agent.json())["type"] == "/problems/forbidden"
    nobody = await roles.client.get("/admin/me")
    assert nobody.status == 401


def test_an_unknown_role_or_a_plain_http_issuer_is_a_config_problem(tmp_path: Path) -> None:
    """check names the field of a role that does not exist, and of an issuer that is not
    https (http is for a loopback host only), in one run."""
    config = write_config(tmp_path, "http://127.0.0.1:1")
    data = yaml.safe_load(config.read_text())
    data["operators"][0]["role"] = "superuser"
    data["oidc"] = {"issuer": "http://idp.example.com/realms/ops", "client_id": "statusgate"}
    config.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as caught:
        load_settings(config, env=PROVIDER_ENV)
    text = "\n".join(caught.value.problems)
    assert "operators[0].role" in text or "operators.0.role" in text
    assert "oidc.issuer: must be an https:// URL" in text
    data["operators"][0]["role"] = "viewer"
    data["oidc"] = {
        "issuer": "http://127.0.0.1:8443/realms/ops",
        "client_id": "statusgate",
        "client_secret": "${STATUSGATE_OIDC_SECRET}",
    }
    config.write_text(yaml.safe_dump(data))
    settings = load_settings(config, env={**PROVIDER_ENV, "STATUSGATE_OIDC_SECRET": "s3cret-x"})
    oidc = settings.file.oidc
    assert oidc is not None and oidc.client_secret is not None
    assert oidc.client_secret.get_secret_value() == "s3cret-x"
    assert "s3cret-x" not in repr(settings)
    assert (oidc.roles_claim, oidc.roles.admin, settings.file.operators[0].role) == (
        "roles",
        [],
        "viewer",
    )

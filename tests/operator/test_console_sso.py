# ruff: noqa: F811 (the fixtures browser, provider and sso come from their test modules)
"""The console's single sign-on (SPEC 25) in a real Chromium: the authorization-code flow
with PKCE against a real OpenID Connect provider on loopback (oidc-provider-mock), whose
own sign-in page lets the test pick the person (predefined users with their claims).

The browser may reach loopback only: every other request (the provider's page links a CSS
file on a CDN) is aborted. ``STATUSGATE_SCREENSHOTS=1`` writes the sign-in and a viewer's
operation page under docs/.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from test_console import REFRESH, Console, browser, escalate, expect  # noqa: F401
from test_sso import CLIENT_ID, Provider, provider, sso  # noqa: F401

from conftest import Harness

pytestmark = pytest.mark.filterwarnings("ignore:get_jwt_config")  # Authlib's, not ours
ROOT = Path(__file__).resolve().parents[2]
LOOPBACK = re.compile(r"^https?://127\.0\.0\.1[:/]")


@pytest.fixture
async def open_console(browser: Any, sso: Harness) -> AsyncIterator[Any]:
    """A console page on ``sso``'s gateway in a context that reaches loopback only."""
    contexts: list[Any] = []

    async def make(width: int = 1280, height: int = 900) -> Console:
        context = await browser.new_context(viewport={"width": width, "height": height})
        contexts.append(context)

        async def only_loopback(route: Any) -> None:
            if LOOPBACK.match(route.request.url):
                await route.continue_()
            else:
                await route.abort()

        await context.route("**/*", only_loopback)
        base = str(sso.client.make_url("")).rstrip("/")
        return await Console(await context.new_page(), base).open()

    yield make
    for context in contexts:
        await context.close()


def console_errors(ui: Console) -> list[str]:
    """Unexpected errors, less Chromium's note on the provider page's CDN file, aborted."""
    return [e for e in ui.unexpected_errors() if e != "Failed to load resource: net::ERR_FAILED"]


async def sign_in_with_sso(ui: Console, person: str) -> None:
    """Press "Sign in with SSO", pick ``person`` on the provider's page, come back."""
    await ui.button("Sign in with SSO").click()
    await expect(ui.page.get_by_role("heading", name="Authorize Client")).to_be_visible()
    await ui.page.get_by_role("button", name=person, exact=True).click()
    await expect(ui.page.locator("#who")).to_contain_text(person)


def b64url_sha256(text: str) -> str:
    digest = hashlib.sha256(text.encode()).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


async def test_a_decider_signs_in_with_sso_and_extends(
    sso: Harness, provider: Provider, open_console: Any
) -> None:
    """Sign in with SSO: the browser goes to the issuer with an S256 challenge of the
    verifier it later hands the gateway, a state and a nonce; back on /console (the code
    gone from the address) it shows the person and role, keeps the ID token in
    sessionStorage (no cookie), and the decider extends an escalation, audited by name."""
    operation = await escalate(sso, "k1")
    ui = await open_console()
    await expect(ui.button("Sign in")).to_be_visible()
    await sign_in_with_sso(ui, "dana")
    await expect(ui.page.locator("#who")).to_have_text("dana (decider)")
    assert urlsplit(ui.page.url).query == ""
    authorize = next(r for r in ui.requests if "/oauth2/authorize" in r.url)
    asked = {k: v[0] for k, v in parse_qs(urlsplit(authorize.url).query).items()}
    assert (asked["response_type"], asked["client_id"]) == ("code", CLIENT_ID)
    assert asked["redirect_uri"] == f"{ui.base}/console"
    assert asked["code_challenge_method"] == "S256"
    assert len(asked["state"]) >= 20 and len(asked["nonce"]) >= 20
    exchange = next(r for r in ui.requests if r.url.endswith("/console/oidc/token"))
    sent = json.loads(exchange.post_data)
    assert b64url_sha256(sent["code_verifier"]) == asked["code_challenge"]
    assert sent["nonce"] == asked["nonce"] and "state" not in sent
    token = await ui.page.evaluate("sessionStorage.getItem('statusgate.operatorToken')")
    assert token.count(".") == 2
    assert await ui.page.evaluate("sessionStorage.length") == 1  # the sign-in attempt is gone
    calls = [r for r in ui.requests if "/admin/" in r.url]
    for call in calls:
        headers = await call.all_headers()
        assert headers["authorization"] == f"Bearer {token}"
        assert "cookie" not in headers
    await ui.page.get_by_role("link", name=operation).click()
    await ui.button("Extend").click()
    await ui.page.get_by_label("Time", exact=True).fill("5m")
    await ui.page.get_by_label("Requests", exact=True).fill("2")
    await ui.page.get_by_label("Reason", exact=True).fill("seen by dana")
    await ui.button("Confirm").click()
    await expect(ui.page.locator("#action-result")).to_contain_text("Extended")
    line = next(x for x in sso.audit_lines() if x["event"] == "extended")
    assert (line["actor"], line["detail"]) == ("dana", "+5m, +2 requests: seen by dana")
    await ui.page.reload()  # the tab keeps its sign-in
    await expect(ui.page.locator("#who")).to_have_text("dana (decider)")
    assert console_errors(ui) == []


async def test_a_viewer_sees_the_escalation_but_no_decision_buttons(
    sso: Harness, provider: Provider, open_console: Any
) -> None:
    """Someone whose groups map to no role signs in as a viewer: the operation page shows
    the escalation, its message and a note saying deciding needs a decider, and no
    Extend, Cancel at provider or Abandon button."""
    operation = await escalate(sso, "k1")
    ui = await open_console()
    await sign_in_with_sso(ui, "val")
    await expect(ui.page.locator("#who")).to_have_text("val (viewer)")
    await ui.page.get_by_role("link", name=operation).click()
    await expect(ui.page.locator("#op-reason")).to_have_text("deadline_exceeded")
    note = ui.page.locator("#op-role-note")
    await expect(note).to_contain_text("deciding it needs a decider or an admin")
    await expect(note).to_contain_text("A decider could now: Extend, Cancel at provider, Abandon.")
    for name in ("Extend", "Cancel at provider", "Abandon", "Resume", "Confirm"):
        await expect(ui.button(name)).to_have_count(0)
    sso.clock.advance(3600 + 61)  # the ID token expires: the next queue refresh says so
    await expect(ui.page.get_by_role("alert")).to_contain_text(
        "Your single sign-on has ended (Single sign-on token refused: the token has expired)",
        timeout=REFRESH + 5_000,
    )
    await expect(ui.button("Sign in with SSO")).to_be_visible()
    assert await ui.page.evaluate("sessionStorage.length") == 0
    assert console_errors(ui) == []


async def test_a_state_that_is_not_this_tabs_is_refused(
    sso: Harness, provider: Provider, open_console: Any
) -> None:
    """A code arriving at /console without this tab's sign-in (a forged or replayed link)
    is not redeemed: the page says so and stays signed out."""
    ui = await open_console()
    await ui.page.goto(f"{ui.base}/console?code=abc&state=not-mine")
    await expect(ui.page.get_by_role("alert")).to_contain_text("does not belong to a sign-in")
    await expect(ui.page.get_by_label("Operator token")).to_be_visible()
    assert not [r for r in ui.requests if r.url.endswith("/console/oidc/token")]
    assert urlsplit(ui.page.url).query == ""


@pytest.mark.skipif(
    os.environ.get("STATUSGATE_SCREENSHOTS") != "1",
    reason="writes docs/console-sso-*.png only with STATUSGATE_SCREENSHOTS=1",
)
async def test_sso_screenshots(
    sso: Harness, provider: Provider, open_console: Any, tmp_path: Path
) -> None:
    """The sign-in panel with its SSO button, and a viewer's operation page, for docs/ (the
    narrow sign-in to a temporary folder, for review)."""
    operation = await escalate(sso, "k1")
    ui = await open_console(width=1280, height=720)
    await expect(ui.button("Sign in with SSO")).to_be_visible()
    await ui.page.screenshot(path=str(ROOT / "docs/console-sso-sign-in.png"))
    await sign_in_with_sso(ui, "val")
    await ui.page.get_by_role("link", name=operation).click()
    await expect(ui.page.locator("#op-role-note")).to_be_visible()
    await ui.page.screenshot(path=str(ROOT / "docs/console-sso-viewer.png"), full_page=True)
    narrow = await open_console(width=390, height=844)
    await narrow.page.goto(f"{narrow.base}/console#/operation/{operation}")
    await expect(narrow.button("Sign in with SSO")).to_be_visible()
    await narrow.page.screenshot(path=str(tmp_path / "sso-sign-in-narrow.png"))
    print(f"review screenshots in {tmp_path}")

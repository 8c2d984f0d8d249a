"""The console's agent keys page (SPEC 25) in a real Chromium, as test_console.py drives
the rest of the console: an admin lists, makes (the token shown once) and revokes keys; a
viewer is offered no keys page."""

from __future__ import annotations

import re
from typing import Any

from test_console import Console, browser, expect, open_console

from conftest import OPERATOR_TOKEN, Harness, sha

__all__ = ["browser", "open_console"]  # the fixtures, used by name

VIEWER = "operator-token-victor"
OPS = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}


async def test_an_admin_makes_a_key_sees_its_token_once_and_revokes_it(
    harness: Harness, open_console: Any
) -> None:
    """Keys in the navigation; Make key with account, providers and a quota shows the
    token once (an agent then submits with it), the list shows the key without it, Done
    forgets it; Revoke asks again, then the key is gone and the agent refused."""
    ui = await open_console()
    await ui.sign_in()
    await ui.page.get_by_role("link", name="Keys").click()
    await expect(ui.page.get_by_role("heading", name="Agent keys")).to_be_visible()
    await expect(ui.page.locator("#keys-summary")).to_have_text("No agent keys yet.")
    await ui.page.get_by_label("Account name", exact=True).fill("team-ui")
    await ui.page.get_by_label("Provider names", exact=True).fill("demo-jobs")
    await ui.page.get_by_label("Submits per hour", exact=True).fill("5")
    await ui.button("Make key").click()
    token_box = ui.page.locator("#key-token")
    await expect(token_box).to_have_text(re.compile(r"^sgk_"))
    token = await token_box.text_content()
    assert token is not None
    made = await harness.submit([{"state": "running"}], token=token, key="ui")
    assert made.status in (200, 201, 202), await made.text()
    row = ui.page.locator("#keys-rows tr")
    await expect(row).to_have_count(1)
    await expect(row).to_contain_text("team-ui")
    await expect(row).to_contain_text("5 per hour")
    assert token not in await ui.page.locator("#keys-table").inner_text()
    await ui.button("Done").click()
    await expect(token_box).to_have_text("")
    await expect(ui.page.locator("#key-made")).to_be_hidden()

    listed = await (await harness.client.get("/admin/keys", headers=OPS)).json()
    key_id = listed["keys"][0]["id"]
    await ui.page.get_by_role("button", name=f"Revoke {key_id}").click()
    await ui.button("Keep").click()
    await expect(row).to_have_count(1)
    await ui.page.get_by_role("button", name=f"Revoke {key_id}").click()
    await ui.page.get_by_role("button", name=f"Revoke {key_id}").click()  # the confirmation
    await expect(ui.page.locator("#keys-summary")).to_have_text("No agent keys yet.")
    assert (await harness.submit(token=token, key="ui-2")).status == 401
    assert [x["event"] for x in harness.audit_lines() if x["event"].startswith("key_")] == [
        "key_created",
        "key_revoked",
    ]
    assert ui.errors == []


async def test_a_bad_key_form_says_what_and_a_viewer_gets_no_keys_page(
    make_harness: Any, browser: Any
) -> None:
    """An unknown provider is refused with the API's detail next to the form; a viewer's
    navigation has no Keys link and #/keys shows the queue instead."""
    operators = [
        {"id": "alice", "token_sha256": sha(OPERATOR_TOKEN)},
        {"id": "victor", "token_sha256": sha(VIEWER), "role": "viewer"},
    ]
    harness: Harness = await make_harness(config_changes={"operators": operators})
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        base = str(harness.client.make_url("")).rstrip("/")
        ui = await Console(await context.new_page(), base).open()
        await ui.sign_in()
        await ui.page.get_by_role("link", name="Keys").click()
        await ui.page.get_by_label("Account name", exact=True).fill("x")
        await ui.page.get_by_label("Provider names", exact=True).fill("nope")
        await ui.button("Make key").click()
        await expect(ui.page.locator("#key-error")).to_contain_text(
            "no policy is loaded for 'nope'"
        )
        await ui.button("Sign out").click()
        await ui.sign_in(VIEWER)
        await expect(ui.page.get_by_role("heading", name="Escalation queue")).to_be_visible()
        await expect(ui.page.get_by_role("link", name="Keys")).to_have_count(0)
        await ui.page.goto(f"{base}/console#/keys")
        await expect(ui.page.get_by_role("heading", name="Agent keys")).to_be_hidden()
        assert ui.unexpected_errors() == []
    finally:
        await context.close()

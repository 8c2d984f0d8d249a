"""The operator console (SPEC 14) in a real Chromium, in front of a real gateway and the
real demo provider (in-process, on loopback TCP ports, with one FakeClock).

Playwright drives Debian's /usr/bin/chromium; without it the browser tests skip with the
reason. Every wait is bounded. ``STATUSGATE_SCREENSHOTS=1`` also writes the screenshots
under docs/ (test_screenshots).
"""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.flow.runtime import RUNTIME
from gateway.operator import console

from conftest import AGENT_TOKEN, OPERATOR_TOKEN, OTHER_TOKEN, PROVIDER_ENV, Harness

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
OPS = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
WAIT = 10_000  # ms: the longest any single browser step may take
REFRESH = 3_000  # ms: the console's queue refresh interval (console.js REFRESH_MS)
CSP = {
    "default-src 'none'",
    "script-src 'self'",
    "style-src 'self'",
    "connect-src 'self'",
    "img-src 'self'",
    "base-uri 'none'",
    "form-action 'none'",
    "frame-ancestors 'none'",
}
# What Chromium logs for every fetch answered 4xx: expected where a test provokes one.
REFUSED_FETCH = re.compile(r"^Failed to load resource: the server responded with a status of 4\d\d")


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    if not CHROMIUM.exists():
        pytest.skip(f"console browser tests skipped: {CHROMIUM} is missing (Debian chromium)")
    api = pytest.importorskip("playwright.async_api", reason="the dev extra playwright is missing")
    async with api.async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, timeout=30_000
        )
        yield launched
        await launched.close()


class Console:
    """One browser page on the gateway's console, collecting console errors and page errors."""

    def __init__(self, page: Any, base: str) -> None:
        self.page = page
        self.base = base
        self.errors: list[str] = []
        self.requests: list[Any] = []
        page.set_default_timeout(WAIT)
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        page.on("request", lambda r: self.requests.append(r))

    async def open(self) -> Console:
        await self.page.goto(f"{self.base}/console", wait_until="load")
        return self

    async def sign_in(self, token: str = OPERATOR_TOKEN, *, enter: bool = False) -> None:
        field = self.page.get_by_label("Operator token", exact=True)
        await field.fill(token)
        if enter:
            await field.press("Enter")
        else:
            await self.page.get_by_role("button", name="Sign in", exact=True).click()

    def button(self, name: str) -> Any:
        return self.page.get_by_role("button", name=name, exact=True)

    def unexpected_errors(self) -> list[str]:
        """Errors other than Chromium's note on each fetch that a test made the API refuse."""
        return [e for e in self.errors if not REFUSED_FETCH.match(e)]


@pytest.fixture
async def open_console(browser: Any, harness: Harness) -> AsyncIterator[Any]:
    """Open a console page (at a viewport width) on ``harness``'s gateway."""
    contexts: list[Any] = []

    async def make(width: int = 1280, height: int = 900) -> Console:
        context = await browser.new_context(viewport={"width": width, "height": height})
        contexts.append(context)
        base = str(harness.client.make_url("")).rstrip("/")
        return await Console(await context.new_page(), base).open()

    yield make
    for context in contexts:
        await context.close()


def expect(target: Any) -> Any:
    from playwright.async_api import expect as playwright_expect

    return playwright_expect(target)


async def escalate(harness: Harness, key: str, *, advance: float = 601) -> str:
    """Submit a job that keeps running, let its deadline pass and poll: an escalated
    operation (deadline_exceeded); its operation id."""
    response = await harness.submit([{"state": "running"}], key=key)
    assert response.status in (200, 201, 202), await response.text()
    job, operation = (await response.json())["id"], response.headers["Statusgate-Operation"]
    harness.clock.advance(advance)
    assert (await harness.poll(job)).status == 409
    return str(operation)


async def show(harness: Harness, operation: str) -> dict[str, Any]:
    response = await harness.client.get(f"/admin/operations/{operation}", headers=OPS)
    assert response.status == 200
    shown: dict[str, Any] = await response.json()
    return shown


# -- the page itself, without a browser ------------------------------------------------------


async def test_console_and_its_assets_carry_a_strict_csp_and_no_sniffing(harness: Harness) -> None:
    """/console and every asset answer with the strict CSP, nosniff and no-referrer headers
    and their own content types; a file that is not an asset is a 404 problem."""
    types = {"/console": "text/html", "/console/": "text/html"}
    types |= {
        f"/console/{name}": kind for name, kind in console.ASSETS.items() if name != "index.html"
    }
    for path, kind in types.items():
        response = await harness.client.get(path)
        assert response.status == 200, path
        assert response.content_type == kind, path
        assert set(response.headers["Content-Security-Policy"].split("; ")) == CSP
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        assert response.headers["Referrer-Policy"] == "no-referrer"
    for path in ("/console/index.html", "/console/nope.js", "/console/..%2Fadmin", "/console/a/b"):
        missing = await harness.client.get(path)
        assert missing.status == 404, path
        assert missing.content_type == "application/problem+json"


async def test_console_names_no_external_host_in_any_asset(harness: Harness) -> None:
    """The page references only its own /console assets, every file in the package is one of
    them, and no served HTML, CSS or JS contains an http(s):// URL or inline script/style."""
    page = await (await harness.client.get("/console")).text()
    referenced = set(re.findall(r'(?:src|href)="([^"#]+)"', page))
    assert referenced == {
        "/console/console.css",
        "/console/console.js",
        "/console/keys.js",
        "/console/logo.png",
    }
    shipped = {p.name for p in Path(console.__file__).parent.iterdir() if p.suffix != ".py"}
    shipped.discard("__pycache__")
    assert shipped == set(console.ASSETS)
    for path in ["/console", *sorted(referenced)]:
        body = await (await harness.client.get(path)).read()
        assert not re.search(rb"https?://", body), path
    assert not re.search(r"<script(?![^>]*\bsrc=)|<style|\sstyle=|\son[a-z]+=", page)


async def test_console_answers_on_the_admin_listener_only(make_harness: Any) -> None:
    """With admin_listen set, the console (like the operator API) is refused on the agent
    listener."""
    config = {"admin_listen": {"host": "127.0.0.1", "port": 1}}
    harness = await make_harness(config_changes=config)
    for path in ("/console", "/console/console.js"):
        refused = await harness.client.get(path)
        assert refused.status == 404
        assert (await refused.json())["type"] == "/problems/route-not-allowed"


# -- signing in ----------------------------------------------------------------------------


async def test_wrong_and_agent_tokens_get_a_clear_message_and_no_data(
    harness: Harness, open_console: Any
) -> None:
    """A wrong token and an agent token (Enter in the field) are refused with a message
    that says which; no operation, queue or navigation is shown and nothing is kept."""
    operation = await escalate(harness, "k1")
    ui = await open_console()
    alert = ui.page.get_by_role("alert")
    await ui.sign_in("not-a-token")
    await expect(alert).to_contain_text("not an operator token")
    await ui.sign_in(AGENT_TOKEN, enter=True)
    await expect(alert).to_contain_text("this is an agent token")
    for hidden in ("Escalation queue", "Operations"):
        await expect(ui.page.get_by_role("heading", name=hidden)).to_have_count(0)
    await expect(ui.page.get_by_text(operation)).to_have_count(0)
    await expect(ui.page.get_by_role("navigation")).to_have_count(0)
    assert await ui.page.evaluate("sessionStorage.length") == 0
    assert ui.unexpected_errors() == []
    await ui.sign_in()
    await expect(ui.page.get_by_role("link", name=operation)).to_be_visible()
    await expect(alert).to_have_count(0)


async def test_operator_token_signs_in_and_is_sent_as_a_bearer_for_this_tab_only(
    harness: Harness, open_console: Any
) -> None:
    """Sign in by Enter; the token is kept in sessionStorage (a reload stays signed in), sent
    as Authorization: Bearer with no cookie, and Sign out forgets it."""
    ui = await open_console()
    await ui.sign_in(enter=True)
    await expect(ui.page.get_by_role("heading", name="Escalation queue")).to_be_visible()
    await expect(ui.page.get_by_role("status").first).to_have_text("No escalations are waiting.")
    assert await ui.page.evaluate("sessionStorage.length") == 1
    await ui.page.reload()
    await expect(ui.page.get_by_role("heading", name="Escalation queue")).to_be_visible()
    await expect(ui.page.get_by_label("Operator token")).to_be_hidden()
    calls = [r for r in ui.requests if "/admin/" in r.url]
    assert len(calls) >= 2
    for call in calls:
        headers = await call.all_headers()
        assert headers["authorization"] == f"Bearer {OPERATOR_TOKEN}"
        assert "cookie" not in headers
    await ui.button("Sign out").click()
    await expect(ui.page.get_by_label("Operator token")).to_be_visible()
    assert await ui.page.evaluate("sessionStorage.length") == 0
    assert ui.errors == []


# -- the queue and the list ---------------------------------------------------------------


async def test_queue_is_oldest_first_and_shows_a_new_escalation_within_one_refresh(
    harness: Harness, open_console: Any
) -> None:
    """Escalations are listed oldest first with id link, provider, account, reason, age and
    message; one escalated while the page is open appears by itself within a refresh."""
    first = await escalate(harness, "k1")
    second = await escalate(harness, "k2")
    ui = await open_console()
    await ui.sign_in()
    rows = ui.page.locator("#queue-rows tr")
    await expect(rows).to_have_count(2)
    await expect(rows.nth(0).get_by_role("link")).to_have_text(first)
    await expect(rows.nth(1).get_by_role("link")).to_have_text(second)
    first_row = rows.nth(0)
    for text in ("demo-jobs", "team-a", "deadline_exceeded", "10 min"):
        await expect(first_row).to_contain_text(text)
    await expect(first_row.locator("pre")).to_contain_text("External job needs a decision")
    await expect(first_row.locator("pre")).to_contain_text(f"Operation: {first}")
    third = await escalate(harness, "k3")
    await expect(rows).to_have_count(3, timeout=REFRESH + 3_000)
    await expect(rows.nth(2).get_by_role("link")).to_have_text(third)
    await expect(ui.page.locator("#queue-count")).to_have_text("3")
    assert ui.errors == []


async def test_operations_filter_by_outcome_provider_and_account_and_page(
    harness: Harness, open_console: Any
) -> None:
    """The operations list filters by outcome, provider and account and pages with Next and
    Previous (cursor paging); every id is a link to its operation."""
    escalated = await escalate(harness, "k0")
    for n in range(11):
        harness.clock.advance(1)
        response = await harness.submit([{"state": "running"}], key=f"k{n + 1}")
        assert response.status in (200, 201, 202)
    harness.clock.advance(1)
    other = await harness.submit([{"state": "running"}], key="b1", token=OTHER_TOKEN)
    team_b = other.headers["Statusgate-Operation"]
    ui = await open_console()
    await ui.sign_in()
    await ui.page.get_by_role("link", name="Operations", exact=True).click()
    rows = ui.page.locator("#operations-rows tr")
    await expect(rows).to_have_count(13)
    await ui.page.get_by_label("Per page").select_option("10")
    await ui.button("Apply filters").click()
    await expect(rows).to_have_count(10)
    await expect(rows.nth(0).get_by_role("link")).to_have_text(team_b)  # newest first
    await expect(ui.button("Previous page")).to_be_disabled()
    await ui.button("Next page").click()
    await expect(rows).to_have_count(3)
    await expect(rows.nth(2).get_by_role("link")).to_have_text(escalated)  # the oldest
    await expect(ui.button("Next page")).to_be_disabled()
    await ui.button("Previous page").click()
    await expect(rows).to_have_count(10)
    await ui.page.get_by_label("Outcome").select_option("escalated")
    await ui.button("Apply filters").click()
    await expect(rows).to_have_count(1)
    await expect(rows.get_by_role("link")).to_have_text(escalated)
    await ui.button("Clear filters").click()
    await expect(rows).to_have_count(13)  # and the page size is 25 again
    await ui.page.get_by_label("Account", exact=True).fill("team-b")
    await ui.page.get_by_label("Provider", exact=True).fill("demo-jobs")
    await ui.page.get_by_label("Account", exact=True).press("Enter")
    await expect(rows).to_have_count(1)
    await expect(rows.get_by_role("link")).to_have_text(team_b)
    await ui.page.get_by_label("Provider", exact=True).fill("azure-read")
    await ui.button("Apply filters").click()
    await expect(ui.page.get_by_text("No operations match.")).to_be_visible()
    await ui.button("Clear filters").click()
    await expect(rows).to_have_count(13)
    await rows.get_by_role("link", name=escalated).click()
    await expect(ui.page.get_by_role("heading", name=f"Operation {escalated}")).to_be_visible()
    assert ui.errors == []


# -- one operation and its actions -------------------------------------------------------


async def test_extend_end_to_end(harness: Harness, open_console: Any) -> None:
    """From the queue to the operation: record, story, budget, only the permitted buttons,
    the bounds; Extend with Time, Requests and Reason, Confirm, and the record is extended."""
    operation = await escalate(harness, "k1")
    ui = await open_console()
    await ui.sign_in()
    await ui.page.get_by_role("link", name=operation).click()
    await expect(ui.page.get_by_role("heading", name=f"Operation {operation}")).to_be_visible()
    for name in ("Extend", "Cancel at provider", "Abandon"):
        await expect(ui.button(name)).to_be_visible()
    await expect(ui.button("Resume")).to_have_count(0)
    await expect(ui.page.locator("#op-budget-text")).to_have_text(
        re.compile(r"^\d+ of 12 status requests used$")
    )
    await expect(ui.page.locator("#op-story li").first).to_contain_text("submitted")
    await expect(ui.page.locator("#op-story li").last).to_contain_text("escalated")
    await expect(ui.page.locator("#op-message")).to_contain_text("Safe options")
    await expect(ui.page.locator("#op-bounds")).to_contain_text("30m and 8 requests in total")
    await ui.button("Extend").click()
    await ui.page.get_by_label("Time", exact=True).fill("10m")
    await ui.page.get_by_label("Requests", exact=True).fill("3")
    await ui.page.get_by_label("Reason", exact=True).fill("big file")
    await ui.button("Confirm").click()
    await expect(ui.page.locator("#action-result")).to_contain_text("Extended")
    await expect(ui.page.locator("#op-no-decision")).to_have_text(
        "No decision is waiting: the operation is pending."
    )
    record = (await show(harness, operation))["record"]
    assert record["outcome"] == "pending"
    assert (record["extended_seconds"], record["extended_requests"]) == (600, 3)
    line = next(x for x in harness.audit_lines() if x["event"] == "extended")
    assert (line["actor"], line["detail"]) == ("alice", "+10m, +3 requests: big file")
    assert line["delay_source"] == "manual_extension"
    story = ui.page.locator("#op-story li", has_text="extended by alice")
    await expect(story).to_have_count(1)
    assert ui.errors == []


async def test_abandon_end_to_end(harness: Harness, open_console: Any) -> None:
    """Abandon asks for a reason before anything is sent, then Confirm abandons: the API
    shows the outcome and agents get operation-escalated (abandoned)."""
    operation = await escalate(harness, "k1")
    ui = await open_console()
    await ui.sign_in()
    await ui.page.goto(f"{ui.base}/console#/operation/{operation}")
    await ui.button("Abandon").click()
    await ui.button("Confirm").click()
    await expect(ui.page.get_by_role("alert")).to_have_text(
        "Give a reason: it goes into the audit log."
    )
    assert (await show(harness, operation))["record"]["outcome"] == "escalated"
    await ui.page.get_by_label("Reason", exact=True).fill("nobody needs it")
    await ui.button("Confirm").click()
    await expect(ui.page.locator("#action-result")).to_contain_text("Abandoned")
    assert (await show(harness, operation))["record"]["outcome"] == "abandoned"
    job = (await show(harness, operation))["record"]["provider_job_id"]
    answer = await harness.poll(job)
    assert answer.status == 409
    assert answer.headers["Statusgate-Outcome"] == "abandoned"
    await expect(ui.page.locator("#queue-count")).to_have_text("")
    assert ui.errors == []


async def test_a_refused_action_shows_the_problem_detail(
    harness: Harness, open_console: Any
) -> None:
    """An extension over the policy's bounds shows the API's own detail and changes nothing."""
    operation = await escalate(harness, "k1")
    ui = await open_console()
    await ui.sign_in()
    await ui.page.goto(f"{ui.base}/console#/operation/{operation}")
    await ui.button("Extend").click()
    await ui.page.get_by_label("Time", exact=True).fill("31m")
    await ui.page.get_by_label("Reason", exact=True).fill("more")
    await ui.button("Confirm").click()
    await expect(ui.page.get_by_role("alert")).to_contain_text(
        "Refused: over the policy's escalation.max_extension of 30m and 8 requests"
    )
    assert (await show(harness, operation))["record"]["outcome"] == "escalated"
    assert ui.unexpected_errors() == []


async def test_resume_is_offered_only_once_it_can_succeed(
    harness: Harness, open_console: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unknown provider state permits Resume and Abandon, but Resume is offered only once
    the policy differs from the one in force at the escalation (before, it could only be
    refused); Extend and Cancel at provider never."""
    job = (await (await harness.submit([{"state": "paused"}])).json())["id"]
    assert (await harness.poll_when_due(job)).status == 409
    operation = (await harness.record(job)).operation_id
    ui = await open_console()
    await ui.sign_in()
    await ui.page.goto(f"{ui.base}/console#/operation/{operation}")
    await expect(ui.button("Abandon")).to_be_visible()
    for name in ("Resume", "Extend", "Cancel at provider"):
        await expect(ui.button(name)).to_have_count(0)
    await expect(ui.page.locator("#op-reason")).to_have_text("unknown_state")
    await expect(ui.page.locator("#op-detail")).to_contain_text('state "paused" is not in')
    config = harness.client.app[RUNTIME].settings.path
    policy = config.parent / "policies" / "demo-jobs.yaml"
    data = yaml.safe_load(policy.read_text())
    data["states"]["pending"].append("paused")
    policy.write_text(yaml.safe_dump(data))
    for name, value in PROVIDER_ENV.items():
        monkeypatch.setenv(name, value)
    reloaded = await harness.client.post("/admin/reload", headers=OPS)
    assert reloaded.status == 200, await reloaded.text()
    await ui.page.reload()
    await expect(ui.button("Resume")).to_be_visible()
    await expect(ui.button("Abandon")).to_be_visible()
    assert ui.errors == []


# -- keyboard and narrow screens ----------------------------------------------------------


async def tab_to(ui: Console, test: str, most: int = 40) -> None:
    """Press Tab until ``test`` (a JS expression on document.activeElement ``a``) holds."""
    for _ in range(most):
        await ui.page.keyboard.press("Tab")
        if await ui.page.evaluate(f"(a => {test})(document.activeElement)"):
            return
    raise AssertionError(f"Tab never reached an element where {test}")


async def focus_ring(ui: Console) -> tuple[str, float]:
    style = "getComputedStyle(document.activeElement)"
    return await ui.page.evaluate(f"[{style}.outlineStyle, parseFloat({style}.outlineWidth)]")


async def no_sideways_scroll(ui: Console) -> bool:
    return bool(await ui.page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"))


async def test_keyboard_only_on_a_narrow_screen(harness: Harness, open_console: Any) -> None:
    """On a 390 px screen, with the keyboard alone: sign in, reach the queue's link (with a
    visible focus ring), open the operation, open an action and close it with Escape (focus
    goes back to its button); nothing scrolls sideways."""
    operation = await escalate(harness, "k1")
    ui = await open_console(width=390, height=844)
    await tab_to(ui, "a.id === 'token'")
    await ui.page.keyboard.type(OPERATOR_TOKEN)
    await ui.page.keyboard.press("Enter")
    await expect(ui.page.get_by_role("link", name=operation)).to_be_visible()
    assert await no_sideways_scroll(ui)
    await tab_to(ui, f"a.textContent === {operation!r}")
    style, width = await focus_ring(ui)
    assert style != "none" and width >= 2
    await ui.page.keyboard.press("Enter")
    await expect(ui.page.get_by_role("heading", name=f"Operation {operation}")).to_be_visible()
    await tab_to(ui, "a.textContent === 'Abandon'")
    style, width = await focus_ring(ui)
    assert style != "none" and width >= 2
    await ui.page.keyboard.press("Enter")
    await expect(ui.page.get_by_label("Reason", exact=True)).to_be_focused()
    assert await no_sideways_scroll(ui)
    await ui.page.keyboard.press("Escape")
    await expect(ui.page.get_by_label("Reason", exact=True)).to_be_hidden()
    await expect(ui.button("Abandon")).to_be_focused()
    assert ui.errors == []


async def test_queue_rows_are_compact_and_decisions_above_the_fold(
    harness: Harness, open_console: Any
) -> None:
    """A queue row is a few lines (the cause in one line, the whole message on demand), at
    1280 and at 390 px; on a 390 x 844 phone the decision buttons are on the first screen,
    and an action's refusal is said once ("Refused: ...", never "Refused: Refused:")."""
    operation = await escalate(harness, "k1")
    for width, height, most in ((1280, 800, 110), (390, 844, 230)):
        ui = await open_console(width=width, height=height)
        await ui.sign_in()
        row = ui.page.locator("#queue-rows tr").first
        await expect(row).to_contain_text("the deadline has passed")
        await expect(row.locator("pre")).to_be_hidden()
        box = await row.bounding_box()
        assert box is not None and box["height"] <= most, (width, box)
        await row.get_by_text("Message", exact=True).click()
        await expect(row.locator("pre")).to_be_visible()
        assert await no_sideways_scroll(ui)
    phone = await open_console(width=390, height=844)
    await phone.sign_in()
    await phone.page.goto(f"{phone.base}/console#/operation/{operation}")
    for name in ("Extend", "Cancel at provider", "Abandon"):
        button = phone.button(name)
        await expect(button).to_be_visible()  # the operation is fetched after the page loads
        box = await button.bounding_box()
        assert box is not None and box["y"] + box["height"] <= 844, (name, box)
    await phone.button("Extend").click()
    await phone.page.get_by_label("Time", exact=True).fill("31m")
    await phone.page.get_by_label("Reason", exact=True).fill("more")
    await phone.button("Confirm").click()
    alert = phone.page.locator("#action-error")
    await expect(alert).to_contain_text("Refused: over the policy's")
    assert "Refused: Refused:" not in await alert.inner_text()


# -- screenshots (docs/console-*.png), only when asked ----------------------------------------


@pytest.mark.skipif(
    os.environ.get("STATUSGATE_SCREENSHOTS") != "1",
    reason="writes docs/console-*.png only with STATUSGATE_SCREENSHOTS=1",
)
async def test_screenshots(harness: Harness, open_console: Any, tmp_path: Path) -> None:
    """Screenshots of the queue and of an operation page at 1280 px (and the operation at
    390 px) for docs/; the queue and the list at 390 px go to a temporary folder for review."""
    first = await escalate(harness, "k1")
    harness.clock.advance(180)
    await escalate(harness, "k2")
    job = (await (await harness.submit([{"state": "paused"}], key="k3")).json())["id"]
    await harness.poll_when_due(job)
    harness.clock.advance(300)
    ui = await open_console(width=1280, height=800)
    await ui.sign_in()
    await expect(ui.page.locator("#queue-rows tr")).to_have_count(3)
    docs = ROOT / "docs"
    docs.mkdir(exist_ok=True)
    await ui.page.screenshot(path=str(docs / "console-queue.png"), full_page=True)
    await ui.page.get_by_role("link", name=first).click()
    await ui.button("Extend").click()
    await ui.page.get_by_label("Time", exact=True).fill("15m")
    await ui.page.get_by_label("Requests", exact=True).fill("4")
    await ui.page.get_by_label("Reason", exact=True).fill("the input file is large")
    await ui.page.get_by_label("Reason", exact=True).blur()
    await ui.page.screenshot(path=str(docs / "console-operation.png"), full_page=True)
    narrow = await open_console(width=390, height=844)
    await narrow.sign_in()
    await expect(narrow.page.locator("#queue-rows tr")).to_have_count(3)
    await narrow.page.screenshot(path=str(tmp_path / "queue-narrow.png"), full_page=True)
    await narrow.page.locator("#nav-operations").click()
    await expect(narrow.page.locator("#operations-rows tr")).to_have_count(3)
    await narrow.page.screenshot(path=str(tmp_path / "operations-narrow.png"), full_page=True)
    await ui.page.locator("#nav-operations").click()
    await expect(ui.page.locator("#operations-rows tr")).to_have_count(3)
    await ui.page.screenshot(path=str(tmp_path / "operations.png"), full_page=True)
    print(f"review screenshots in {tmp_path}")
    await narrow.page.get_by_role("link", name=first).click()
    await expect(narrow.button("Extend")).to_be_visible()
    await narrow.page.screenshot(path=str(docs / "console-operation-narrow.png"), full_page=True)
    await narrow.page.screenshot(path=str(tmp_path / "operation-narrow-first-screen.png"))
    await narrow.page.locator("#nav-queue").click()
    await narrow.page.screenshot(path=str(tmp_path / "queue-narrow-first-screen.png"))
    assert ui.errors == [] and narrow.errors == []


async def test_an_ended_operation_shows_its_usage(harness: Harness, open_console: Any) -> None:
    """SPEC 23: the operation page lists the usage numbers the final answer reported."""
    response = await harness.submit([{"state": "succeeded"}], key="u1")
    job, operation = (await response.json())["id"], response.headers["Statusgate-Operation"]
    assert (await harness.poll_when_due(job)).status == 200
    ui = await open_console()
    await ui.sign_in()
    await ui.page.get_by_role("link", name="Operations", exact=True).click()
    await ui.page.locator("#operations-rows").get_by_role("link", name=operation).click()
    await expect(ui.page.get_by_role("heading", name=f"Operation {operation}")).to_be_visible()
    await expect(ui.page.locator("#op-record")).to_contain_text(
        "Usageinput_tokens 1200, output_tokens 350, pages 3"
    )
    assert ui.errors == []

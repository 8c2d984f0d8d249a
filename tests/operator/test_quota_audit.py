"""Quota refusals in the audit log (SPEC 25, docs/operators.md "Quotas"): a submission
refused 429 quota-exceeded is audited ``quota_exceeded`` naming the account, the key by id
(never its token), the provider, the quota, its limit and Retry-After; a caller hammering a
full quota costs one line when a window opens and one with the count when it closes, not one
a call; the lines belong to no operation's story and the chain verifies. On SQLite, Redis and
PostgreSQL: which quota is named comes from the wait each store's claim answers."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import pytest

from gateway.core.keys import ACTIVE_RETRY, reached
from gateway.core.story import story
from gateway.flow import quotas
from gateway.flow.runtime import RUNTIME
from gateway.observe.audit import read_lines, verify
from gateway.observe.stories import verify_chains
from gateway.settings.config import Quotas

from conftest import OPERATOR_TOKEN, Harness

ADMIN = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}


@pytest.fixture(params=["sqlite", "redis", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param in ("redis", "postgres"):
        return str(request.getfixturevalue(f"{request.param}_url"))
    return f"sqlite:///{tmp_path}/g.db"


async def make_key(harness: Harness, quotas: dict[str, int]) -> dict[str, Any]:
    body = {"account": "team-k", "providers": ["demo-jobs"], "quotas": quotas}
    made = await harness.client.post("/admin/keys", json=body, headers=ADMIN)
    assert made.status == 201, await made.text()
    answer: dict[str, Any] = await made.json()
    return answer


def quota_lines(harness: Harness) -> list[dict[str, Any]]:
    return [line for line in harness.audit_lines() if line["event"] == "quota_exceeded"]


async def refused_count(harness: Harness) -> float:
    scrape = await (await harness.client.get("/metrics")).text()
    found = re.search(
        r'statusgate_agent_requests_total\{outcome="quota-exceeded",provider="demo-jobs",'
        r'route="submit"\} (\S+)',
        scrape,
    )
    return float(found.group(1)) if found else 0.0


async def test_a_full_quota_is_audited_once_a_window_with_the_count(
    make_harness: Any, store_url: str
) -> None:
    """The first 429 of a key's max_active_operations is a quota_exceeded line (count 1)
    before the answer; four more within its window add no line; once the window ended, the
    next refusal writes the four's line and its own, and the sweeper's close writes the
    rest. The counts add up to the refusals the metric counted; no line carries the token;
    none is in the pending operation's story; the chain verifies."""
    harness: Harness = await make_harness(store_url=store_url)
    runtime = harness.client.app[RUNTIME]
    made = await make_key(harness, {"max_active_operations": 1, "submits_per_hour": 100})
    token = made["token"]
    first = await harness.submit([{"state": "running"}], token=token, key="first")
    assert first.status == 202, await first.text()
    operation = first.headers["Statusgate-Operation"]

    async def refuse(n: int) -> None:
        answer = await harness.submit(token=token, key=f"again-{n}")
        assert answer.status == 429 and answer.headers["Retry-After"] == "30"

    await refuse(0)
    lines = quota_lines(harness)  # written before the answer
    assert len(lines) == 1
    line = lines[0]
    assert line["operation_id"] is None and line["account"] == "team-k"
    assert line["key_id"] == made["id"] and line["provider"] == "demo-jobs"
    assert (line["quota"], line["limit"], line["retry_after"]) == ("max_active_operations", 1, 30)
    assert (line["count"], line["http_status"], line["decision"]) == (1, 429, "quota-exceeded")
    for n in range(1, 5):
        await refuse(n)
    assert len(quota_lines(harness)) == 1
    harness.clock.advance(ACTIVE_RETRY + 1)  # the window (its Retry-After) ended
    await refuse(5)
    lines = quota_lines(harness)
    assert [line["count"] for line in lines] == [1, 4, 1]
    assert lines[1]["detail"].startswith("4 more refused since ")
    await refuse(6)
    await refuse(7)
    harness.clock.advance(ACTIVE_RETRY + 1)
    await quotas.close_windows(runtime)  # what the sweeper does each second
    await quotas.close_windows(runtime)  # once
    lines = quota_lines(harness)
    assert [line["count"] for line in lines] == [1, 4, 1, 2]
    assert sum(line["count"] for line in lines) == await refused_count(harness) == 8
    text = harness.audit_path.read_text()
    assert token not in text and hashlib.sha256(token.encode()).hexdigest() not in text
    told = story(harness.audit_lines(), operation)
    assert told and not any("quota" in said for said in told), told
    assert verify(read_lines(harness.audit_path), None).intact
    mirror = runtime.effects.mirror
    assert (mirror is not None) == store_url.startswith("postgresql")
    if mirror is not None:  # PostgreSQL keeps the lines too: its chain verifies as well
        await mirror.close()  # ships what is left, as at shutdown
        (chain,) = await verify_chains(runtime.store.audit_lines, None)
        assert chain.verdict.intact and chain.verdict.records == len(harness.audit_lines())


async def test_the_hourly_quota_is_named_with_its_retry_after(
    make_harness: Any, store_url: str
) -> None:
    """A config account's submits_per_hour refusal is audited naming that quota, its limit
    and the Retry-After the agent was told, with no key id (a config account's token); a
    window still open at shutdown gets its line then."""
    accounts = [{"id": "team-q", "token_sha256": hashlib.sha256(b"tok-q").hexdigest()}]
    accounts[0]["quotas"] = {"submits_per_hour": 1}  # type: ignore[assignment]
    harness: Harness = await make_harness(
        store_url=store_url, config_changes={"accounts": accounts}
    )
    assert (await harness.submit([{"state": "running"}], token="tok-q", key="a")).status == 202
    harness.clock.advance(100)
    refused = await harness.submit(token="tok-q", key="b")
    assert refused.status == 429
    (line,) = quota_lines(harness)
    assert (line["account"], line["key_id"], line["quota"], line["limit"]) == (
        "team-q",
        None,
        "submits_per_hour",
        1,
    )
    assert line["retry_after"] == int(refused.headers["Retry-After"]) == 3500
    harness.clock.advance(1)
    assert (await harness.submit(token="tok-q", key="c")).status == 429  # counted
    await harness.client.close()  # shutdown writes the open window's line
    assert [(line["count"], line["retry_after"]) for line in quota_lines(harness)] == [
        (1, 3500),
        (1, 3499),
    ]
    assert "tok-q" not in harness.audit_path.read_text()


@pytest.mark.parametrize(
    ("limits", "wait", "named"),
    [
        ({"max_active_operations": 2}, ACTIVE_RETRY, ("max_active_operations", 2)),
        ({"submits_per_hour": 5}, 12.5, ("submits_per_hour", 5)),
        ({"submits_per_hour": 5}, ACTIVE_RETRY, ("submits_per_hour", 5)),
        ({"max_active_operations": 2, "submits_per_hour": 5}, 12.5, ("submits_per_hour", 5)),
        ({"max_active_operations": 2, "submits_per_hour": 5}, 3599.2, ("submits_per_hour", 5)),
        (
            {"max_active_operations": 2, "submits_per_hour": 5},
            ACTIVE_RETRY,
            ("max_active_operations", 2),
        ),
    ],
)
def test_the_quota_named_is_the_one_that_set_the_wait(
    limits: dict[str, int], wait: float, named: tuple[str, int]
) -> None:
    """The active limit always waits ACTIVE_RETRY and the longer wait wins, so the wait
    tells which quota refused (the one that set Retry-After when both are reached)."""
    assert reached(Quotas(**limits), wait) == named

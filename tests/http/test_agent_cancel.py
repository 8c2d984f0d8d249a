"""SPEC 20a: ``routes.cancel.by: agent`` lets an agent of the operation's account cancel its
own job: forwarded once, audited ``cancel_requested`` with the account, then polled until
the provider reports the outcome; ``by: operator`` (the default) keeps 403."""

from __future__ import annotations

from typing import Any

from conftest import OTHER_TOKEN, Harness

BY_AGENT = {"demo-jobs": {"routes": {"cancel": {"by": "agent"}}}}


async def job_of(response: Any) -> str:
    assert response.status == 202, await response.text()
    return str((await response.json())["id"])


def cancels(harness: Harness, job: str) -> int:
    return len([e for e in harness.provider.log if e["job_id"] == job and e["kind"] == "cancel"])


async def cancel(harness: Harness, job: str, token: str | None = None) -> Any:
    headers = harness.auth(token) if token else harness.auth()
    return await harness.client.post(f"/p/demo-jobs/v1/jobs/{job}/cancel", headers=headers)


async def test_an_agent_cancel_is_forwarded_once_audited_and_polled_to_cancelled(
    make_harness: Any,
) -> None:
    """Two cancels of one job by its own account reach the provider once: the first gets
    the provider's answer, the second is answered from the record; one ``cancel_requested``
    audit line names the account; the operation stays pending with ``cancel_requested_at``
    and the agent's next permitted poll finds it cancelled."""
    harness: Harness = await make_harness(policy_changes=BY_AGENT)
    job = await job_of(await harness.submit([{"state": "running"}]))
    assert (await harness.poll_when_due(job)).status == 200

    first = await cancel(harness, job)
    assert first.status == 200, await first.text()
    assert (await first.json())["state"] == "cancelled"  # the provider's answer to the cancel
    record = await harness.record(job)
    assert first.headers["Statusgate-Operation"] == record.operation_id
    assert record.outcome.value == "pending" and record.cancel_requested_at is not None
    second = await cancel(harness, job)
    assert second.status == 202, await second.text()
    assert (await second.json())["cancel_requested_at"] is not None
    assert second.headers["Statusgate-Outcome"] == "pending"
    assert cancels(harness, job) == 1

    lines = [line for line in harness.audit_lines() if line["event"] == "cancel_requested"]
    assert len(lines) == 1, harness.audit_lines()
    assert lines[0]["account"] == "team-a" and lines[0]["actor"] == "account:team-a"
    assert lines[0]["operation_id"] == record.operation_id and lines[0]["http_status"] == 200

    ended = await harness.poll_when_due(job)
    assert ended.status == 200 and ended.headers["Statusgate-Outcome"] == "cancelled"
    assert (await harness.record(job)).outcome.value == "cancelled"
    after = await cancel(harness, job)
    assert after.status == 200 and after.headers["Statusgate-Outcome"] == "cancelled"
    assert cancels(harness, job) == 1


async def test_another_accounts_cancel_is_unknown_operation(make_harness: Any) -> None:
    """An agent of another account cancelling the job gets 404 unknown-operation, as for a
    status call, and nothing reaches the provider."""
    harness: Harness = await make_harness(policy_changes=BY_AGENT)
    job = await job_of(await harness.submit([{"state": "running"}]))
    answer = await cancel(harness, job, OTHER_TOKEN)
    assert answer.status == 404
    assert (await answer.json())["type"] == "/problems/unknown-operation"
    assert cancels(harness, job) == 0
    assert (await harness.record(job)).cancel_requested_at is None


async def test_by_operator_is_still_approval_required(make_harness: Any) -> None:
    """``routes.cancel.by: operator`` (written out, as the default is): an agent's cancel
    is 403 approval-required and never forwarded."""
    changes = {"demo-jobs": {"routes": {"cancel": {"by": "operator"}}}}
    harness: Harness = await make_harness(policy_changes=changes)
    job = await job_of(await harness.submit([{"state": "running"}]))
    answer = await cancel(harness, job)
    assert answer.status == 403
    assert (await answer.json())["type"] == "/problems/approval-required"
    assert cancels(harness, job) == 0

"""SPEC 20 over HTTP, on a fake clock in front of the demo provider: early calls answered with
the last provider answer (``early_calls: replay``), results addressed by their own value, and
no route of a shipped policy that lets one account read another's output."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp.test_utils import TestServer

from gateway.core.decide import lookup
from gateway.core.models import Outcome
from gateway.demo.provider import BATCH_OUTPUT, output_file
from gateway.settings.policy import ProviderPolicy, load_policy, warnings

from conftest import (
    AGENT_TOKEN,
    OTHER_TOKEN,
    PROVIDER_ENV,
    ROOT,
    Harness,
    real_time_harness,
    sha,
)

REPLAY = {"demo-jobs": {"polling": {"early_calls": "replay"}}}
BOTH_EVERYWHERE = {
    "accounts": [
        {"id": "team-a", "token_sha256": [sha(AGENT_TOKEN)], "providers": ["*"]},
        {"id": "team-b", "token_sha256": [sha(OTHER_TOKEN)], "providers": ["*"]},
    ]
}


async def slug(response: Any) -> str:
    return str((await response.json())["type"]).removeprefix("/problems/")


def status_calls(harness: Harness, job: str) -> int:
    return len([e for e in harness.provider.log if e["job_id"] == job and e["kind"] == "status"])


async def started(harness: Harness, script: list[dict[str, Any]]) -> str:
    """A demo-jobs job submitted and polled once (when due): the id."""
    submitted = await harness.submit(script)
    assert submitted.status == 202, await submitted.text()
    job = str((await submitted.json())["id"])
    first = await harness.poll_when_due(job)
    assert first.status == 200, await first.text()
    return job


# -- early_calls: replay ---------------------------------------------------------------------


async def test_an_early_call_gets_the_last_answer_as_a_cache_would(
    make_harness: Callable[..., Any], provider_server: TestServer
) -> None:
    """The replay is the provider's last status and body (URL-rewritten) with Age,
    Retry-After, Retry-After-Ms, Statusgate-Next-Poll-At and outcome pending; nothing is
    sent and no budget is spent; the metric counts it as cached."""
    harness: Harness = await make_harness(policy_changes=REPLAY)
    upstream = str(provider_server.make_url("")).rstrip("/")
    step = {"state": "running", "set": {"status_url": f"{upstream}/v1/jobs/elsewhere"}}
    job = await started(harness, [step, {"state": "succeeded"}])
    record = await harness.record(job)
    harness.clock.advance(0.25)
    early = await harness.poll(job)
    assert early.status == 200, await early.text()
    body = await early.json()
    assert body["state"] == "running"
    assert body["status_url"] == "http://gateway.test/p/demo-jobs/v1/jobs/elsewhere"
    assert early.headers["Content-Type"].startswith("application/json")
    assert early.headers["Age"] == "0"
    assert early.headers["Statusgate-Outcome"] == "pending"
    assert early.headers["Statusgate-Operation"] == record.operation_id
    wait = record.next_poll_at - harness.clock.now
    assert early.headers["Retry-After-Ms"] == str(int(wait * 1000 + 0.999))
    assert int(early.headers["Retry-After"]) >= wait
    assert "Statusgate-Next-Poll-At" in early.headers
    harness.clock.advance(max(0.0, wait - 0.01))
    later = await harness.poll(job)
    assert later.status == 200 and later.headers["Age"] == str(int(wait - 0.01 + 0.25))
    assert status_calls(harness, job) == 1
    assert (await harness.record(job)).status_requests_used == record.status_requests_used
    metrics = await (await harness.client.get("/metrics")).text()
    assert (
        'statusgate_agent_requests_total{outcome="cached",provider="demo-jobs",route="status"} 2.0'
        in metrics
    )
    done = await harness.poll_when_due(job)
    assert done.headers["Statusgate-Outcome"] == "succeeded" and status_calls(harness, job) == 2


async def test_prefer_wait_still_holds_the_call_under_replay(
    make_harness: Callable[..., Any],
) -> None:
    """Prefer: wait is honoured as before: the call is held to the next permitted poll and
    answered by it, not by a replay."""
    harness: Harness = await make_harness(policy_changes=REPLAY)
    job = await started(harness, [{"state": "running"}, {"state": "succeeded"}])
    held = await harness.poll(job, headers={"Prefer": "wait=30"})
    assert held.status == 200 and "Age" not in held.headers
    assert held.headers["Preference-Applied"] == "wait=30"
    assert held.headers["Statusgate-Outcome"] == "succeeded"
    assert status_calls(harness, job) == 2


async def test_an_early_call_with_nothing_to_replay_is_held_for_the_first_poll(
    make_harness: Callable[..., Any],
) -> None:
    """SPEC 20a: under replay, an early call right after a 202 submit (no status answer
    recorded yet) is held until the first permitted poll and answered by it (200, never a
    429); when that poll is further away than max_hold, it is 429 too-early, nothing sent."""
    harness: Harness = await make_harness(policy_changes=REPLAY)
    submitted = await harness.submit([{"state": "running"}, {"state": "succeeded"}])
    assert submitted.status == 202, await submitted.text()
    job = str((await submitted.json())["id"])
    due = (await harness.record(job)).next_poll_at
    assert harness.clock.now < due
    early = await harness.poll(job)
    assert early.status == 200, await early.text()
    assert (await early.json())["state"] == "running" and "Age" not in early.headers
    assert "Preference-Applied" not in early.headers
    assert harness.clock.now >= due and status_calls(harness, job) == 1
    replayed = await harness.poll(job)  # now there is an answer to replay
    assert replayed.status == 200 and "Age" in replayed.headers
    assert status_calls(harness, job) == 1

    far = await harness.submit([{"state": "running"}], key="far", submit={"poll_after_seconds": 90})
    far_job = str((await far.json())["id"])
    refused = await harness.poll(far_job)
    assert (refused.status, await slug(refused)) == (429, "too-early")
    assert int(refused.headers["Retry-After"]) > 60
    assert status_calls(harness, far_job) == 0


async def test_no_replay_after_a_5xx_or_a_transport_failure(
    make_harness: Callable[..., Any],
) -> None:
    """A record whose last answer was a 5xx (or no answer) is not replayed: the early call
    gets the usual 429 too-early problem."""
    harness: Harness = await make_harness(policy_changes=REPLAY)
    job = await started(harness, [{"state": "running"}, {"http": 503}, {"state": "running"}])
    failed = await harness.poll_when_due(job)
    assert (failed.status, await slug(failed)) == (503, "provider-unavailable")
    early = await harness.poll(job)
    assert (early.status, await slug(early)) == (429, "too-early")
    assert early.headers["X-Should-Retry"] == "true"
    assert status_calls(harness, job) == 2
    again = await harness.poll_when_due(job)
    assert again.status == 200
    replayed = await harness.poll(job)
    assert replayed.status == 200 and "Age" in replayed.headers


async def test_escalated_over_budget_and_unknown_operations_are_never_replayed(
    make_harness: Callable[..., Any],
) -> None:
    """Their 409 and 404 problems stay: a replay never hides that waiting has to end."""
    changes = {"demo-jobs": {"polling": {"early_calls": "replay", "max_status_requests": 1}}}
    harness: Harness = await make_harness(policy_changes=changes)
    job = await started(harness, [{"state": "running"}])
    spent = await harness.poll(job)
    assert (spent.status, await slug(spent)) == (409, "operation-escalated")
    assert (await spent.json())["reason"] == "request_budget_exhausted"
    again = await harness.poll(job)
    assert (again.status, await slug(again)) == (409, "operation-escalated")
    unknown = await harness.poll("job_nobody_has")
    assert (unknown.status, await slug(unknown)) == (404, "unknown-operation")
    assert status_calls(harness, job) == 1


async def test_a_pending_submit_answer_is_replayed_before_the_first_poll(
    make_harness: Callable[..., Any],
) -> None:
    """openai-batch as shipped: batches.create's 200 answer is what a retrieve loop sees
    until the first permitted poll, without any provider status call."""
    harness: Harness = await make_harness()
    created = await harness.submit(
        [{"state": "in_progress"}], provider="openai-batch", path="/v1/batches", key=None
    )
    batch = (await created.json())["id"]
    early = await harness.poll(batch, provider="openai-batch", path="/v1/batches/{job_id}")
    assert early.status == 200, await early.text()
    assert (await early.json())["status"] == "validating"
    assert early.headers["Statusgate-Outcome"] == "pending"
    assert status_calls(harness, batch) == 0


# -- results by value ------------------------------------------------------------------------


async def completed_batch(harness: Harness, token: str = AGENT_TOKEN) -> str:
    created = await harness.submit(
        [{"state": "completed"}], provider="openai-batch", path="/v1/batches", key=None, token=token
    )
    batch = str((await created.json())["id"])
    done = await harness.poll_when_due(
        batch, provider="openai-batch", path="/v1/batches/{job_id}", token=token
    )
    assert done.headers["Statusgate-Outcome"] == "succeeded", await done.text()
    return batch


async def test_the_output_is_fetched_by_its_own_file_id_gated_counted_and_audited(
    make_harness: Callable[..., Any],
) -> None:
    """GET /v1/files/<output_file_id>/content reaches the account's batch whose final
    answer names that file: forwarded, counted on that operation (up to
    max_result_fetches) and audited as result_fetched with its id."""
    changes = {"openai-batch": {"polling": {"max_result_fetches": 2}}}
    harness: Harness = await make_harness(policy_changes=changes)
    batch = await completed_batch(harness)
    record = await harness.record(batch, "openai-batch")
    value = output_file(batch)
    assert record.result_values == (value,)
    url = f"/p/openai-batch/v1/files/{value}/content"
    fetched = await harness.client.get(url, headers=harness.auth())
    assert fetched.status == 200, await fetched.text()
    assert await fetched.read() == BATCH_OUTPUT
    assert fetched.headers["Statusgate-Operation"] == record.operation_id
    assert harness.provider.log[-1]["path"] == f"/v1/files/{value}/content"
    line = harness.audit_lines()[-1]
    assert (line["event"], line["operation_id"]) == ("result_fetched", record.operation_id)
    by_job = await harness.client.get(
        f"/p/openai-batch/v1/files/{batch}/content", headers=harness.auth()
    )
    assert by_job.status == 200  # the batch id still addresses it too
    calls = len(harness.provider.log)
    over = await harness.client.get(url, headers=harness.auth())
    assert (over.status, await slug(over)) == (409, "result-budget-exhausted")
    assert (await harness.record(batch, "openai-batch")).result_fetches == 2
    assert len(harness.provider.log) == calls


async def test_a_value_no_operation_of_the_account_has_is_404_and_never_forwarded(
    make_harness: Callable[..., Any],
) -> None:
    """Another account's output, a pending batch's future output, an uploaded input file
    and an invented id: all 404 unknown-operation, nothing sent to the provider."""
    harness: Harness = await make_harness(config_changes=BOTH_EVERYWHERE)
    batch = await completed_batch(harness)
    created = await harness.submit(
        [{"state": "in_progress"}], provider="openai-batch", path="/v1/batches", key=None
    )
    pending = (await created.json())["id"]
    upload = await harness.client.post(
        "/p/openai-batch/v1/files", data=b"{}\n", headers=harness.auth()
    )
    uploaded = (await upload.json())["id"]
    calls = len(harness.provider.log)
    for token, value in [
        (OTHER_TOKEN, output_file(batch)),
        (AGENT_TOKEN, output_file(pending)),
        (AGENT_TOKEN, uploaded),
        (AGENT_TOKEN, "file-invented"),
    ]:
        url = f"/p/openai-batch/v1/files/{value}/content"
        answer = await harness.client.get(url, headers=harness.auth(token))
        assert (answer.status, await slug(answer)) == (404, "unknown-operation"), value
    assert len(harness.provider.log) == calls


# -- no reads across accounts ----------------------------------------------------------------


def shipped() -> list[ProviderPolicy]:
    env = {**PROVIDER_ENV, "DEMO_API_KEY": "k"}
    return [
        load_policy(path, path.name, env) for path in sorted((ROOT / "policies").glob("*.yaml"))
    ]


def test_no_shipped_policy_reads_objects_by_id_or_lists_jobs_through_passthrough() -> None:
    """statusgate check has no warning for any shipped policy: no passthrough GET with a
    placeholder, no listing of every account's jobs."""
    for policy in shipped():
        assert warnings(policy) == [], policy.provider


def test_check_warns_about_passthrough_reads_by_id_and_listings(tmp_path: Path) -> None:
    """The old openai-batch passthrough download and a batch listing are named by check."""
    source = yaml.safe_load((ROOT / "policies/openai-batch.yaml").read_text())
    source["routes"].pop("result")
    source["routes"]["passthrough"] += [
        {"method": "GET", "path": "/v1/files/{file_id}/content"},
        {"method": "GET", "path": "/v1/batches"},
    ]
    path = tmp_path / "openai-batch.yaml"
    path.write_text(yaml.safe_dump(source))
    found = warnings(load_policy(path, path.name, {"OPENAI_API_KEY": "k"}))
    assert [where for where, _ in found] == ["routes.passthrough[1]", "routes.passthrough[2]"]
    assert "any account can read any other account's" in found[0][1]
    assert "lists the jobs of every account" in found[1][1]


RUNS: dict[str, tuple[str, dict[str, Any], list[dict[str, Any]]]] = {
    # provider: submit path, submit body, script
    "openai-batch": ("/v1/batches", {}, [{"state": "completed"}]),
    "batch-api": ("/v1/batches", {}, [{"state": "completed"}]),
    "anthropic-batches": (
        "/v1/messages/batches",
        {"requests": [{"custom_id": "r1", "params": {}}]},
        [{"state": "ended"}],
    ),
    "demo-jobs": ("/v1/jobs", {}, [{"state": "succeeded"}]),
    "google-operations": ("/v1/projects/p/locations/l/jobs", {}, [{"state": "done"}]),
    "openai-responses": (
        "/v1/responses",
        {"model": "m", "input": "x", "background": True},
        [{"state": "completed"}],
    ),
    "openai-fine-tuning": (
        "/v1/fine_tuning/jobs",
        {"model": "m", "training_file": "file-t"},
        [{"state": "succeeded"}],
    ),
    "azure-openai-batch": (
        "/openai/batches?api-version=2024-10-21",
        {"input_file_id": "file-i", "endpoint": "/chat/completions"},
        [{"state": "completed"}],
    ),
    "groq-batch": ("/openai/v1/batches", {"input_file_id": "file_i"}, [{"state": "completed"}]),
    "together-batch": ("/v1/batches", {"input_file_id": "file-i"}, [{"state": "COMPLETED"}]),
    "mistral-batch": ("/v1/batch/jobs", {"input_files": ["f"]}, [{"state": "SUCCESS"}]),
    "fireworks-batch": (
        "/v1/accounts/a/batchInferenceJobs",
        {"model": "m", "inputDatasetId": "accounts/a/datasets/in"},
        [{"state": "JOB_STATE_COMPLETED"}],
    ),
}


async def test_account_b_cannot_read_account_a_output_by_any_declared_route(
    make_harness: Callable[..., Any],
) -> None:
    """For every shipped policy the demo provider speaks, A's job runs to success; B then
    asks for it by every declared status, result and cancel route, with A's job id and
    with every value of A's final answer: never forwarded, never A's data."""
    harness: Harness = await make_harness(config_changes=BOTH_EVERYWHERE)
    policies = {p.provider: p for p in shipped()}
    for provider, (path, body, script) in RUNS.items():
        policy = policies[provider]
        key = "a-key" if policy.routes.submit.idempotency.required else None
        created = await harness.submit(script, provider=provider, path=path, key=key, body=body)
        assert created.status in (200, 202), await created.text()
        job = str(lookup(await created.json(), policy.routes.submit.job_id.path))
        status_path = policy.routes.status.path
        done = await harness.poll_when_due(job, provider=provider, path=fill_job(status_path))
        assert done.headers["Statusgate-Outcome"] == "succeeded", (provider, await done.text())
        a_record = await harness.record(job, provider)
        values = [job, *a_record.result_values]
        calls = len(harness.provider.log)
        for kind in ("status", "result", "cancel"):
            route = getattr(policy.routes, kind)
            if route is None:
                continue
            for value in values:
                url = f"/p/{provider}" + fill_any(route.path, value)
                answer = await harness.client.request(
                    route.method, url, headers=harness.auth(OTHER_TOKEN)
                )
                text = await answer.text()
                assert answer.status in (403, 404), (provider, kind, value, text)
                assert a_record.operation_id not in text
        assert len(harness.provider.log) == calls, provider
        assert (await harness.record(job, provider)).outcome is Outcome.SUCCEEDED


def fill_job(path: str) -> str:
    """A status path template for Harness.poll: its job placeholder as ``{job_id}``."""
    return path.replace("{job_id*}", "{job_id}")


def fill_any(path: str, value: str) -> str:
    """A route path with every placeholder filled with ``value`` (fixed query dropped)."""
    return re.sub(r"\{[^{}]*\}", value, path.partition("?")[0])


@pytest.fixture(params=["sqlite", "redis", "redis-cluster"])
def durable_store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The stores that serialise records: a SQLite file, Redis, a Redis Cluster."""
    if request.param == "redis":
        return str(request.getfixturevalue("redis_url"))
    if request.param == "redis-cluster":
        return str(request.getfixturevalue("redis_cluster_url"))
    return f"sqlite:///{tmp_path}/g.db"


async def test_replay_and_results_by_value_through_every_durable_store(
    tmp_path: Path, durable_store: str
) -> None:
    """On real time and a store that serialises records (its compare-and-set scripts
    included), an early call is replayed from the stored answer and the output is found by
    its value once the batch completed."""
    polling = {"base_delay": "300ms", "max_delay": "300ms", "jitter": {"min": 1, "max": 1}}
    changes = {"openai-batch": {"polling": polling}}
    async with real_time_harness(
        tmp_path, store_url=durable_store, policy_changes=changes
    ) as harness:
        script = [{"state": "in_progress"}, {"state": "completed"}]
        created = await harness.submit(
            script, provider="openai-batch", path="/v1/batches", key=None
        )
        batch = (await created.json())["id"]
        path = "/v1/batches/{job_id}"
        early = await harness.poll(batch, provider="openai-batch", path=path)
        assert early.status == 200 and (await early.json())["status"] == "validating"
        polled = await harness.poll_when_due(batch, provider="openai-batch", path=path)
        assert (await polled.json())["status"] == "in_progress"
        replayed = await harness.poll(batch, provider="openai-batch", path=path)
        assert replayed.status == 200 and "Age" in replayed.headers
        assert (await replayed.json())["status"] == "in_progress"
        done = await harness.poll_when_due(batch, provider="openai-batch", path=path)
        assert done.headers["Statusgate-Outcome"] == "succeeded"
        url = f"/p/openai-batch/v1/files/{output_file(batch)}/content"
        fetched = await harness.client.get(url, headers=harness.auth())
        assert fetched.status == 200 and await fetched.read() == BATCH_OUTPUT
        assert status_calls(harness, batch) == 2

"""policies/cohere-embed-jobs.yaml driven by the official ``cohere`` SDK at its defaults
(only ``base_url`` changed, the gateway token as its API key), on virtual time, against the
demo provider's Cohere double (gateway/demo/pack/cohere_embed_jobs.py), with the policy's
schedule as shipped: ``datasets.create``, ``embed_jobs.create``, then the SDK's own
``client.wait`` or a naive ``embed_jobs.get`` loop, and ``datasets.get`` of the output."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cohere
import pytest
from paced import assert_paced, operator_headers, shipped_polling
from test_sdk_agents import MAX_CALLS, Setup, gateway, polls_at, result_fetches, table

from gateway.demo.pack.cohere_embed_jobs import output_dataset
from gateway.flow.runtime import RUNTIME

from conftest import AGENT_TOKEN, PROVIDER_KEY

PROVIDER = "cohere-embed-jobs"
DONE = {"complete", "failed", "cancelled"}
ROWS = b'{"text": "the first document"}\n{"text": "the second document"}\n'
SCRIPT = [
    {"state": "processing", "until": 600},
    {"state": "complete"},
]


def client(setup: Setup) -> cohere.Client:
    return cohere.Client(api_key=AGENT_TOKEN, base_url=f"{setup.base}/p/{PROVIDER}")


def submit(co: cohere.Client, script: list[dict[str, Any]]) -> Any:
    """What an agent does: upload the input dataset, then start the embed job on it."""
    dataset = co.datasets.create(name="docs", type="embed-input", data=("docs.jsonl", ROWS))
    return co.embed_jobs.create(
        model="embed-english-v3.0",
        dataset_id=dataset.id,
        input_type="search_document",
        request_options={"additional_body_parameters": {"demo_script": script}},
    )


def provider_headers_ok(setup: Setup) -> None:
    for entry in setup.demo.log:
        assert entry["headers"]["Authorization"] == f"Bearer {PROVIDER_KEY}"
        assert AGENT_TOKEN not in str(entry["headers"])


async def test_cohere_wait_helper_and_datasets_get_at_default_settings(tmp_path: Path) -> None:
    """``client.wait(embed_job)`` (every 2 s) returns the complete job, no exception, the
    provider polled on the policy's schedule; ``datasets.get(output_dataset_id)`` reaches
    the output through the gateway's counted result route, its parts' URLs untouched."""
    async with gateway(tmp_path) as setup:
        co, agent = client(setup), setup.agent
        started = agent.clock.now

        def work() -> tuple[Any, Any]:
            created = submit(co, SCRIPT)
            job = co.wait(created)
            return job, co.datasets.get(id=job.output_dataset_id)

        job, output = await agent.run(work)
        times = polls_at(setup.demo, job.job_id)
        fetched = await result_fetches(setup, PROVIDER, job.job_id)
    table("cohere 7.3.1", "client.wait + datasets.get", agent, len(times))
    assert job.status == "complete" and job.output_dataset_id == output_dataset(job.job_id)
    assert output.dataset.dataset_type == "embed-result"
    assert output.dataset.dataset_parts[0].url.startswith("https://storage.googleapis.com/")
    assert fetched == 1
    assert_paced(times, started, shipped_polling(PROVIDER))
    assert len(agent.calls) > 3 * len(times)  # the helper's 2 s calls, mostly replayed
    provider_headers_ok(setup)


async def test_cohere_naive_get_loop_at_default_settings(tmp_path: Path) -> None:
    """A naive ``embed_jobs.get`` loop with no sleep ends complete with no exception, the
    provider polled on schedule; the output dataset comes through the result route."""
    async with gateway(tmp_path) as setup:
        co, agent = client(setup), setup.agent
        started = agent.clock.now

        def work() -> tuple[Any, Any]:
            job = co.embed_jobs.get(id=submit(co, SCRIPT).job_id)
            while job.status not in DONE and len(agent.calls) < MAX_CALLS:
                try:
                    job = co.embed_jobs.get(id=job.job_id)
                except cohere.core.ApiError as error:
                    agent.caught(error)
            return job, co.datasets.get(id=job.output_dataset_id)

        job, output = await agent.run(work)
        times = polls_at(setup.demo, job.job_id)
    table("cohere 7.3.1", "naive embed_jobs.get + datasets.get", agent, len(times))
    assert agent.exceptions == []
    assert job.status == "complete" and output.dataset.id == job.output_dataset_id
    assert_paced(times, started, shipped_polling(PROVIDER))


async def test_cohere_cancel_by_an_operator_passes_through_cancelling(tmp_path: Path) -> None:
    """The agent's ``embed_jobs.cancel`` is 403 approval-required; an operator's cancel
    reaches Cohere once; the job reports cancelling (still pending), then cancelled, which
    ends the operation; the SDK's wait helper then raises, as it does on any cancelled
    job, and the output dataset of a cancelled job is never fetched."""
    async with gateway(tmp_path) as setup:
        co, agent = client(setup), setup.agent
        created = await agent.run(lambda: submit(co, [{"state": "processing"}]))
        with pytest.raises(cohere.ForbiddenError):
            await agent.run(lambda: co.embed_jobs.cancel(id=created.job_id))
        record = await setup.client.app[RUNTIME].store.find("team-a", PROVIDER, created.job_id)
        answer = await setup.client.post(
            f"/admin/operations/{record.operation_id}/cancel",
            json={"reason": "wrong model"},
            headers=operator_headers(),
        )
        assert answer.status == 200, await answer.text()

        def work() -> tuple[list[str], str]:
            seen, job = [], co.embed_jobs.get(id=created.job_id)
            while job.status not in DONE and len(agent.calls) < MAX_CALLS:
                seen.append(job.status)
                job = co.embed_jobs.get(id=created.job_id)
            try:
                co.wait(created)
            except Exception as error:
                return seen, str(error)
            return seen, "no exception"

        seen, raised = await agent.run(work)
        record = await setup.client.app[RUNTIME].store.find("team-a", PROVIDER, created.job_id)
        kinds = [e["kind"] for e in setup.demo.log if e["job_id"] == created.job_id]
    table("cohere 7.3.1", "naive get, operator cancel", agent, kinds.count("status"))
    assert "cancelling" in seen
    assert record.outcome.value == "cancelled"
    assert raised == f"Embed job {created.job_id} failed with status cancelled"
    assert kinds.count("cancel") == 1 and "result" not in kinds
    provider_headers_ok(setup)

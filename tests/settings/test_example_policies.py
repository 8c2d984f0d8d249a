"""The shipped example policies, each driven end to end against the demo provider."""

from __future__ import annotations

from gateway.demo.provider import output_file

from conftest import PROVIDER_KEY, Harness

AZURE = "/documentintelligence/documentModels/prebuilt-read"


async def test_batch_api_lifecycle(harness: Harness) -> None:
    """validating -> in_progress -> finalizing -> completed, with output_file_id required."""
    script = [
        {"state": "validating"},
        {"state": "in_progress"},
        {"state": "finalizing"},
        {"state": "completed"},
    ]
    response = await harness.submit(script, provider="batch-api", path="/v1/batches", key=None)
    assert response.status == 200
    job = (await response.json())["id"]
    assert response.headers["Statusgate-Provider-State"] == "validating"
    assert "Location" in response.headers
    seen = []
    for _ in range(4):
        polled = await harness.poll_when_due(job, provider="batch-api", path="/v1/batches/{job_id}")
        assert polled.status == 200
        seen.append(polled.headers["Statusgate-Provider-State"])
    assert seen == ["validating", "in_progress", "finalizing", "completed"]
    assert polled.headers["Statusgate-Outcome"] == "succeeded"
    assert (await polled.json())["output_file_id"] == output_file(job)
    record = await harness.record(job, "batch-api")
    # 30s base delay, doubling: the provider saw four calls spread over minutes
    assert record.next_poll_at - record.started_at > 60


async def test_batch_api_completed_without_output_stays_pending(harness: Harness) -> None:
    """A completed batch without its output file id is still pending, shown to the agent
    with a pending state; the answer that carries the file id ends it succeeded."""
    script = [{"state": "completed", "omit": ["output_file_id"]}, {"state": "completed"}]
    response = await harness.submit(script, provider="batch-api", path="/v1/batches", key=None)
    job = (await response.json())["id"]
    polled = await harness.poll_when_due(job, provider="batch-api", path="/v1/batches/{job_id}")
    assert polled.status == 200 and polled.headers["Statusgate-Outcome"] == "pending"
    assert (await polled.json())["status"] != "completed"
    done = await harness.poll_when_due(job, provider="batch-api", path="/v1/batches/{job_id}")
    assert done.headers["Statusgate-Outcome"] == "succeeded"


async def test_batch_api_cancelling_is_pending_then_cancelled(harness: Harness) -> None:
    """A cancelling batch is pending and then ends cancelled."""
    script = [{"state": "cancelling"}, {"state": "cancelled"}]
    response = await harness.submit(script, provider="batch-api", path="/v1/batches", key=None)
    job = (await response.json())["id"]
    first = await harness.poll_when_due(job, provider="batch-api", path="/v1/batches/{job_id}")
    assert first.headers["Statusgate-Outcome"] == "pending"
    second = await harness.poll_when_due(job, provider="batch-api", path="/v1/batches/{job_id}")
    assert second.headers["Statusgate-Outcome"] == "cancelled"


async def test_azure_lro_job_id_from_operation_location(harness: Harness) -> None:
    """202 with an empty body: the job id comes from Operation-Location, which is rewritten
    to the gateway (query kept); the credential goes in the provider's own header."""
    script = [
        {"state": "NotStarted"},
        {"state": "Running", "retry_after": "3"},
        {"state": "Succeeded"},
    ]
    response = await harness.submit(
        script, provider="azure-read", path=f"{AZURE}:analyze?api-version=2024-11-30", key=None
    )
    assert response.status == 202
    location = response.headers["Operation-Location"]
    assert location.startswith(f"http://gateway.test/p/azure-read{AZURE}/analyzeResults/")
    assert location.endswith("?api-version=2024-11-30")
    job = location.split("/analyzeResults/")[1].split("?")[0]
    path = AZURE + "/analyzeResults/{job_id}?api-version=2024-11-30"
    states = []
    for _ in range(3):
        polled = await harness.poll_when_due(job, provider="azure-read", path=path)
        states.append((await polled.json())["status"])
        if states[-1] == "Running":
            assert polled.headers["Retry-After"] == "3"
            assert (await harness.record(job, "azure-read")).delay_source == "provider_retry_after"
    assert states == ["NotStarted", "Running", "Succeeded"]
    assert polled.headers["Statusgate-Outcome"] == "succeeded"
    calls = harness.provider_calls(job)
    assert all(c["headers"]["Ocp-Apim-Subscription-Key"] == PROVIDER_KEY for c in calls)
    assert all("api-version=2024-11-30" in c["path"] for c in calls)


async def test_azure_failed_is_terminal(harness: Harness) -> None:
    """Azure's Failed status is a terminal failed outcome."""
    response = await harness.submit(
        [{"state": "Failed"}], provider="azure-read", path=f"{AZURE}:analyze", key=None
    )
    job = response.headers["Operation-Location"].split("/analyzeResults/")[1].split("?")[0]
    polled = await harness.poll_when_due(
        job, provider="azure-read", path=AZURE + "/analyzeResults/{job_id}"
    )
    assert polled.headers["Statusgate-Outcome"] == "failed"
    assert (await polled.json())["error"]["code"] == "demo_failure"

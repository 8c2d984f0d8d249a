"""policies/bedrock-batch.yaml driven by the real ``boto3`` "bedrock" client at its default
settings (retries, timeouts), only its endpoint changed and the gateway token as its access
key id, against the demo provider's double of Bedrock batch inference
(gateway/demo/pack/bedrock_batch.py, which checks every request's SigV4 signature), on
virtual time with the policy's production schedule (tests/sdk/cloud_agents.py).

boto3 has no waiter for model invocation jobs: the agent is a naive
``get_model_invocation_job`` loop. The results are JSONL files on S3 (another host, not
through the gateway); what the SDK fetches through the gateway is the final job, whose
``outputDataConfig`` names them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import boto3
import botocore.exceptions
from cloud_agents import Setup, assert_paced, gateway, phases, polls_at, row

from gateway.demo.pack.bedrock_batch import ARN_PREFIX, FAMILY

from conftest import AGENT_TOKEN, OPERATOR_TOKEN, PROVIDER_KEY

PROVIDER = "bedrock-batch"
ENDED = ("Completed", "PartiallyCompleted", "Failed", "Stopped", "Expired")
JOB = {
    "jobName": "nightly-summaries",
    "roleArn": "arn:aws:iam::123456789012:role/BedrockBatchRole",
    "modelId": "anthropic.claude-3-haiku-20240307-v1:0",
    "inputDataConfig": {"s3InputDataConfig": {"s3Uri": "s3://team-in/records.jsonl"}},
    "outputDataConfig": {"s3OutputDataConfig": {"s3Uri": "s3://team-out/summaries/"}},
}
# Twenty minutes in each pending status: a job of well over an hour.
SCRIPT = phases("Submitted", "Validating", "Scheduled", "InProgress", last="Completed", each=1200)
STEP = 5.0  # virtual seconds a turn of the naive loop takes


def bedrock(setup: Setup) -> Any:
    """boto3's client at its defaults, the gateway as endpoint, its token as the key id."""
    return boto3.client(
        "bedrock",
        endpoint_url=f"{setup.base}/p/{PROVIDER}",
        aws_access_key_id=AGENT_TOKEN,
        aws_secret_access_key="agent-has-no-aws-secret",
        region_name="us-east-1",
    )


def naive_loop(setup: Setup, client: Any) -> tuple[str, dict[str, Any]]:
    """Create the job and get it again at once until it has ended; errors are caught,
    counted and the loop goes on, as an agent's would."""
    agent = setup.agent
    arn = str(client.create_model_invocation_job(**JOB)["jobArn"])
    job: dict[str, Any] = {"status": "Submitted"}
    while job.get("status") not in ENDED and not agent.busy:
        try:
            job = client.get_model_invocation_job(jobIdentifier=arn)
        except botocore.exceptions.ClientError as error:
            agent.caught(error)
    return arn, job


async def test_boto3_naive_loop_through_an_80_minute_batch_job(tmp_path: Path) -> None:
    """A naive get_model_invocation_job loop at boto3's defaults sees the job through every
    pending status to Completed with no exception, the provider polled no sooner than the
    policy's schedule allows, every request signed with the gateway's key, and the final
    job (by ARN, then by its trailing id) names the output location."""
    async with gateway(tmp_path, scripts={FAMILY.name: SCRIPT}, step=STEP) as setup:
        client, agent = bedrock(setup), setup.agent
        started = agent.clock.now
        arn, job = await agent.run(lambda: naive_loop(setup, client))
        again = await agent.run(lambda: client.get_model_invocation_job(jobIdentifier=arn))
        tail = arn.removeprefix(ARN_PREFIX)
        by_id = await agent.run(lambda: client.get_model_invocation_job(jobIdentifier=tail))
        record = await setup.record(PROVIDER, arn)
        times = polls_at(setup.demo, arn)
        polling = setup.polling(PROVIDER)
        elapsed = agent.clock.now - started
    row(PROVIDER, "boto3 bedrock", "naive get_model_invocation_job", agent, len(times), elapsed)
    assert agent.exceptions == []
    assert job["status"] == "Completed" and record.outcome.value == "succeeded"
    assert job["outputDataConfig"]["s3OutputDataConfig"]["s3Uri"] == "s3://team-out/summaries/"
    assert again["status"] == by_id["status"] == "Completed"  # the ARN's id: the same job
    assert by_id["jobArn"] == arn
    assert_paced(times, started, polling)
    assert len(times) == record.status_requests_used  # the two later gets: from the record
    for entry in setup.demo.log:
        assert entry["headers"]["Authorization"].startswith(
            f"AWS4-HMAC-SHA256 Credential={PROVIDER_KEY}/"
        )
        assert AGENT_TOKEN not in str(entry["headers"])


async def test_a_failed_job_ends_failed_with_its_message(tmp_path: Path) -> None:
    """Failed is a terminal failure: the loop ends on it, the message kept."""
    script = [{"state": "Validating", "until": 600}, {"state": "Failed"}]
    async with gateway(tmp_path, scripts={FAMILY.name: script}) as setup:
        client, agent = bedrock(setup), setup.agent
        arn, job = await agent.run(lambda: naive_loop(setup, client))
        record = await setup.record(PROVIDER, arn)
    assert agent.exceptions == []
    assert job["status"] == "Failed" and "scripted failure" in job["message"]
    assert record.outcome.value == "failed"


async def test_an_operator_stop_is_sent_by_arn_and_ends_stopped(tmp_path: Path) -> None:
    """An operator's cancel is StopModelInvocationJob with the ARN percent-encoded in its
    one segment, as boto3 would send it; the job goes Stopping (still pending) and then
    Stopped, the cancelled outcome, which the agent's loop sees."""
    script = [{"state": "InProgress"}]
    async with gateway(tmp_path, scripts={FAMILY.name: script}) as setup:
        client, agent = bedrock(setup), setup.agent
        arn = await agent.run(lambda: str(client.create_model_invocation_job(**JOB)["jobArn"]))
        record = await setup.record(PROVIDER, arn)
        answer = await setup.client.post(
            f"/admin/operations/{record.operation_id}/cancel",
            json={"reason": "the inputs were wrong"},
            headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"},
        )
        assert answer.status == 200, await answer.text()

        def loop() -> dict[str, Any]:
            job: dict[str, Any] = {"status": "InProgress"}
            while job["status"] not in ENDED and not agent.busy:
                job = client.get_model_invocation_job(jobIdentifier=arn)
            return job

        job = await agent.run(loop)
        record = await setup.record(PROVIDER, arn)
    stops = [e for e in setup.demo.log if e["kind"] == "cancel"]
    assert [e["path"] for e in stops] == [
        f"/model-invocation-job/{arn.replace(':', '%3A').replace('/', '%2F')}/stop"
    ]
    assert job["status"] == "Stopped" and record.outcome.value == "cancelled"

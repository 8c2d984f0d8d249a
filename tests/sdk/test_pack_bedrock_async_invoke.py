"""policies/bedrock-async-invoke.yaml driven by the real ``boto3`` "bedrock-runtime" client
at its default settings, only its endpoint changed and the gateway token as its access key
id, against the demo provider's double of Bedrock Runtime's asynchronous invocations
(gateway/demo/pack/bedrock_async_invoke.py, which checks every request's SigV4 signature
under the service name ``bedrock``), on virtual time with the policy's production schedule
(tests/sdk/cloud_agents.py).

boto3 has no waiter for async invocations: the agent is a naive ``get_async_invoke`` loop,
the invocation ARN percent-encoded by boto3 into the path. The output (a video) is written
to S3, another host; what the SDK fetches through the gateway is the final invocation,
whose ``outputDataConfig`` names it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import boto3
import botocore.exceptions
from cloud_agents import Setup, assert_paced, gateway, phases, polls_at, row

from gateway.demo.pack.bedrock_async_invoke import FAMILY

from conftest import AGENT_TOKEN, PROVIDER_KEY

PROVIDER = "bedrock-async-invoke"
VIDEO = {
    "modelId": "amazon.nova-reel-v1:1",
    "modelInput": {
        "taskType": "TEXT_VIDEO",
        "textToVideoParams": {"text": "A lighthouse at dawn, waves below"},
        "videoGenerationConfig": {"durationSeconds": 120, "fps": 24, "dimension": "1280x720"},
    },
    "outputDataConfig": {"s3OutputDataConfig": {"s3Uri": "s3://team-videos/lighthouse/"}},
}


def runtime(setup: Setup) -> Any:
    """boto3's client at its defaults, the gateway as endpoint, its token as the key id."""
    return boto3.client(
        "bedrock-runtime",
        endpoint_url=f"{setup.base}/p/{PROVIDER}",
        aws_access_key_id=AGENT_TOKEN,
        aws_secret_access_key="agent-has-no-aws-secret",
        region_name="us-east-1",
    )


def naive_loop(setup: Setup, client: Any) -> tuple[str, dict[str, Any]]:
    """Start the invocation and get it again at once until it has ended; errors are
    caught, counted and the loop goes on."""
    agent = setup.agent
    arn = str(client.start_async_invoke(**VIDEO)["invocationArn"])
    invocation: dict[str, Any] = {"status": "InProgress"}
    while invocation["status"] == "InProgress" and not agent.busy:
        try:
            invocation = client.get_async_invoke(invocationArn=arn)
        except botocore.exceptions.ClientError as error:
            agent.caught(error)
    return arn, invocation


async def test_boto3_naive_loop_through_a_two_minute_video(tmp_path: Path) -> None:
    """A naive get_async_invoke loop at boto3's defaults sees a 17-minute video job to
    Completed with no exception, the provider polled no sooner than the policy's schedule
    allows, every request signed with the gateway's key, and the final invocation names
    the output location."""
    script = phases("InProgress", last="Completed", each=17 * 60)
    async with gateway(tmp_path, scripts={FAMILY.name: script}) as setup:
        client, agent = runtime(setup), setup.agent
        started = agent.clock.now
        arn, invocation = await agent.run(lambda: naive_loop(setup, client))
        record = await setup.record(PROVIDER, arn)
        times = polls_at(setup.demo, arn)
        polling = setup.polling(PROVIDER)
        elapsed = agent.clock.now - started
    row(PROVIDER, "boto3 bedrock-runtime", "naive get_async_invoke", agent, len(times), elapsed)
    assert agent.exceptions == []
    assert invocation["status"] == "Completed" and record.outcome.value == "succeeded"
    output = invocation["outputDataConfig"]["s3OutputDataConfig"]["s3Uri"]
    assert output == "s3://team-videos/lighthouse/"
    assert_paced(times, started, polling)
    for entry in setup.demo.log:
        assert entry["headers"]["Authorization"].startswith(
            f"AWS4-HMAC-SHA256 Credential={PROVIDER_KEY}/"
        )
        assert "/bedrock/aws4_request" in entry["headers"]["Authorization"]
        assert AGENT_TOKEN not in str(entry["headers"])


async def test_a_failed_invocation_ends_failed_with_its_message(tmp_path: Path) -> None:
    """Failed is a terminal failure: the loop ends on it, failureMessage kept."""
    script = [{"state": "InProgress", "until": 120}, {"state": "Failed"}]
    async with gateway(tmp_path, scripts={FAMILY.name: script}) as setup:
        client, agent = runtime(setup), setup.agent
        arn, invocation = await agent.run(lambda: naive_loop(setup, client))
        record = await setup.record(PROVIDER, arn)
    assert agent.exceptions == []
    assert invocation["status"] == "Failed" and "scripted" in invocation["failureMessage"]
    assert record.outcome.value == "failed"

"""The Google, AWS and Flower doubles of the demo provider refuse what their real services
refuse: a double that accepts anything would agree with a wrong policy."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestClient, TestServer
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from gateway.demo.provider import DemoProvider

KEY = "demo-double-key"


@pytest.fixture
async def double() -> AsyncIterator[TestClient[object, object]]:
    client: TestClient[object, object] = TestClient(TestServer(DemoProvider(api_key=KEY).app()))
    await client.start_server()
    yield client
    await client.close()


def signed(
    url: str, body: dict[str, object], secret: str, service: str, **headers: str
) -> dict[str, str]:
    """The headers of a request signed by botocore with key id KEY and ``secret``."""
    request = AWSRequest(method="POST", url=url, data=json.dumps(body).encode(), headers=headers)
    SigV4Auth(Credentials(KEY, secret), service, "us-east-1").add_auth(request)
    return dict(request.headers.items())


async def test_transcribe_double_checks_the_sigv4_signature(
    double: TestClient[object, object],
) -> None:
    """A StartTranscriptionJob signed with the wrong secret is 403 InvalidSignatureException;
    the same request signed with the demo key starts the job."""
    url = str(double.make_url("/aws-transcribe/"))
    body = {"TranscriptionJobName": "call-1", "Media": {"MediaFileUri": "s3://b/c.wav"}}
    target = {"X-Amz-Target": "Transcribe.StartTranscriptionJob"}
    wrong = signed(url, body, "not-the-secret", "transcribe", **target)
    answer = await double.post("/aws-transcribe/", data=json.dumps(body), headers=wrong)
    assert answer.status == 403
    assert (await answer.json(content_type=None))["__type"] == "InvalidSignatureException"
    right = signed(url, body, KEY, "transcribe", **target)
    answer = await double.post("/aws-transcribe/", data=json.dumps(body), headers=right)
    assert answer.status == 200
    assert (await answer.json(content_type=None))["TranscriptionJob"][
        "TranscriptionJobName"
    ] == "call-1"


async def test_bedrock_double_refuses_a_signature_for_another_service(
    double: TestClient[object, object],
) -> None:
    """A CreateModelInvocationJob signed for the service ``bedrock-runtime`` is refused:
    Bedrock signs under ``bedrock``."""
    url = str(double.make_url("/bedrock-batch/model-invocation-job"))
    body = {"jobName": "j", "roleArn": "r", "modelId": "m", "inputDataConfig": {}}
    body["outputDataConfig"] = {}
    headers = signed(url, body, KEY, "bedrock-runtime")
    answer = await double.post(
        "/bedrock-batch/model-invocation-job", data=json.dumps(body), headers=headers
    )
    assert answer.status == 403


async def test_gemini_double_refuses_a_wrong_key_and_knows_no_stranger_batch(
    double: TestClient[object, object],
) -> None:
    """A wrong x-goog-api-key is 400 API_KEY_INVALID; a batch it never made is 404."""
    answer = await double.get("/gemini-batch/v1beta/batches/nope", headers={"x-goog-api-key": "x"})
    assert answer.status == 400
    assert (await answer.json())["error"]["details"][0]["reason"] == "API_KEY_INVALID"
    answer = await double.get("/gemini-batch/v1beta/batches/nope", headers={"x-goog-api-key": KEY})
    assert answer.status == 404


async def test_flower_double_answers_pending_for_a_task_it_never_saw(
    double: TestClient[object, object],
) -> None:
    """As Celery does, an unknown task id is PENDING; an unknown task name is 404; a call
    without Flower's basic auth is 401."""
    auth = {"Authorization": f"Basic {KEY}"}
    answer = await double.get("/celery-flower/api/task/result/no-such-task", headers=auth)
    assert (await answer.json()) == {"task-id": "no-such-task", "state": "PENDING"}
    answer = await double.post(
        "/celery-flower/api/task/async-apply/tasks.nope", json={}, headers=auth
    )
    assert answer.status == 404
    answer = await double.get("/celery-flower/api/task/result/no-such-task")
    assert answer.status == 401


async def test_veo_paths_answer_an_operation_then_its_video(
    double: TestClient[object, object],
) -> None:
    """Under /google-operations, predictLongRunning answers an Operation named
    models/{model}/operations/{id}; operations.get answers it running (done absent), then
    done with a Files API URI, whose download is the video; a wrong key is refused."""
    base = "/google-operations/v1beta"
    key = {"x-goog-api-key": KEY}
    body = {"instances": [{"prompt": "a lighthouse"}], "demo_script": [{"state": "running"}]}
    body["demo_script"].append({"state": "done"})
    answer = await double.post(f"{base}/models/veo-3.0-generate-001:predictLongRunning", json=body)
    assert answer.status == 400  # no key
    answer = await double.post(
        f"{base}/models/veo-3.0-generate-001:predictLongRunning", json=body, headers=key
    )
    name = (await answer.json())["name"]
    assert name.startswith("models/veo-3.0-generate-001/operations/")
    running = await (await double.get(f"{base}/{name}", headers=key)).json()
    assert "done" not in running
    done = await (await double.get(f"{base}/{name}", headers=key)).json()
    uri = done["response"]["generateVideoResponse"]["generatedSamples"][0]["video"]["uri"]
    assert done["done"] is True and uri.startswith("https://generativelanguage.googleapis.com/")
    path = uri.removeprefix("https://generativelanguage.googleapis.com")
    video = await double.get("/google-operations" + path, headers=key)
    assert video.status == 200 and video.content_type == "video/mp4"

"""The S3 result store (SPEC 23) against moto's S3-compatible server: credentials that
expire (a web identity, a credential process, SSO) are fetched again before they run out,
not read once when the store opens."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.settings.keeping import S3Target
from gateway.store.results import ResultStoreError, s3
from gateway.store.results.s3 import S3Results

BUCKET = "s3-results"


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    """moto's S3-compatible server on a free loopback port, with the test bucket."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing-key",
        aws_secret_access_key="testing-secret",
    ).create_bucket(Bucket=BUCKET)
    yield endpoint
    server.stop()


def expiring_credentials(folder: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A profile whose credentials come from a credential process, each set good for five
    minutes (less than botocore's refresh margins); the process logs every call."""
    calls = folder / "calls"
    script = folder / "credentials.py"
    script.write_text(
        "import datetime, json, pathlib\n"
        f"calls = pathlib.Path({str(calls)!r})\n"
        "with calls.open('a') as f: f.write('x\\n')\n"
        "n = len(calls.read_text().splitlines())\n"
        "until = datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=5)\n"
        "print(json.dumps({'Version': 1, 'AccessKeyId': f'AKIDTEST{n}',"
        " 'SecretAccessKey': 'secret', 'SessionToken': 'token',"
        " 'Expiration': until.isoformat()}))\n"
    )
    config = folder / "config"
    config.write_text(f"[default]\ncredential_process = {sys.executable} {script}\n")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(folder / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return calls


async def test_expiring_credentials_are_fetched_again(
    moto_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Credentials about to expire are fetched again for a later request (a web identity's
    last an hour): a store open longer than that keeps working."""
    calls = expiring_credentials(tmp_path, monkeypatch)
    store = S3Results(S3Target(BUCKET, "expiring/", moto_endpoint, "us-east-1"))
    await store.open()
    try:
        opened = len(calls.read_text().splitlines())
        writer = store.writer("00000000001-op_one")
        await writer.write(b"result")
        await writer.commit()
        body = b"".join([chunk async for chunk in store.read("00000000001-op_one")])
        assert body == b"result"
        assert len(calls.read_text().splitlines()) > opened
    finally:
        await store.close()


def test_credential_script_answers_as_botocore_expects(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The test's credential process gives botocore refreshable credentials (so the test
    above proves a refresh, not a misread profile)."""
    expiring_credentials(tmp_path, monkeypatch)
    import botocore.session

    found = botocore.session.get_session().get_credentials()
    assert found is not None
    assert found.get_frozen_credentials().access_key.startswith("AKIDTEST")
    assert hasattr(found, "refresh_needed")


async def test_a_slow_reader_gets_the_whole_copy(
    moto_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy read for longer than one S3 request may take (an agent reading a large kept
    result slowly) arrives whole: the bound is on connecting and on each read, not on the
    whole answer."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing-secret")
    monkeypatch.setattr(s3, "TIMEOUT", 3.0)
    store = S3Results(S3Target(BUCKET, "slow/", moto_endpoint, "us-east-1"))
    await store.open()
    try:
        data = bytes(range(256)) * 4096  # 1 MiB: 16 chunks or more
        writer = store.writer("00000000001-op_slow")
        await writer.write(data)
        await writer.commit()
        body = bytearray()
        async for chunk in store.read("00000000001-op_slow"):
            body += chunk
            await asyncio.sleep(0.25)  # a reader slower than the whole answer's bound
        assert bytes(body) == data
    finally:
        await store.close()


async def test_credentials_that_cannot_be_read_are_a_result_store_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A profile that does not exist (or a credential process that fails) is a
    ResultStoreError naming the problem, which the result route answers by forwarding as
    before, never an error of botocore's own (a 500)."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_PROFILE", "no-such-profile")
    store = S3Results(S3Target(BUCKET, "p/", "http://127.0.0.1:9", "us-east-1"))
    with pytest.raises(ResultStoreError, match="no-such-profile"):
        await store.open()
    await store.close()

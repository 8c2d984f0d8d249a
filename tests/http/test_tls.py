"""TLS on the listeners (SPEC 25): a real ``statusgate serve`` (uvloop, the lane) speaking
HTTPS with certificates of a CA made in the test, driven by the openai SDK, ``requests`` and
curl trusting that CA; client certificates (mutual TLS) on the admin listener; and a
certificate rotated on disk served to new connections after SIGHUP, a bad one refused with
the running one kept."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import openai
import pytest
import requests
import yaml
from certs import Issued, TestCA, serial_of

from gateway.demo.provider import DemoProvider, output_file

from conftest import (
    AGENT_TOKEN,
    OPERATOR_TOKEN,
    PROVIDER_ENV,
    ROOT,
    Served,
    fast_polling,
    free_port,
    merge,
    wait_until_up,
)

INPUT = b'{"custom_id": "request-1", "method": "POST", "url": "/v1/chat/completions"}\n'
TERMINAL = {"completed", "failed", "expired", "cancelled"}


def tls_of(server: Issued, ca: TestCA | None = None, **more: str) -> dict[str, str]:
    files = {"cert_file": str(server.cert), "key_file": str(server.key)}
    if ca is not None:
        files["client_ca_file"] = str(ca.cert)
    return {**files, **more}


def https_gateway(
    folder: Path,
    upstream: str,
    server: Issued,
    *,
    admin_ca: TestCA | None = None,
    admin_port: int = 0,
) -> Served:
    """A gateway whose agent listener speaks TLS with ``server``'s certificate (and, with
    ``admin_ca``, an admin listener asking for client certificates of that CA)."""
    served = Served(
        folder,
        upstream,
        folder / "gateway.db",
        policy_changes={
            name: {"polling": fast_polling()} for name in ("demo-jobs", "openai-batch")
        },
    )
    config: dict[str, Any] = {
        "listen": {"port": served.port, "tls": tls_of(server)},
        "public_base_url": f"https://127.0.0.1:{served.port}",
    }
    if admin_ca is not None:
        tls = tls_of(server, admin_ca)
        config["admin_listen"] = {"host": "127.0.0.1", "port": admin_port, "tls": tls}
    data = merge(yaml.safe_load(served.config.read_text()), config)
    served.config.write_text(yaml.safe_dump(data))
    return served


def served_serial(port: int, ca: Path) -> int:
    """The serial number of the certificate a new connection to ``port`` is served."""
    context = ssl.create_default_context(cafile=str(ca))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return serial_of(der)


async def started(served: Served) -> Served:
    await served.up()
    return served


# -- the openai SDK -------------------------------------------------------------------------


def run_batch(client: openai.OpenAI) -> dict[str, Any]:
    """Upload, create, retrieve until terminal, download: the agent a batch user writes."""
    uploaded = client.files.create(file=("input.jsonl", INPUT), purpose="batch")
    script = [{"state": "in_progress"}, {"state": "completed"}]
    batch = client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        extra_body={"demo_script": script},
    )
    stop = time.monotonic() + 60
    while batch.status not in TERMINAL and time.monotonic() < stop:
        batch = client.batches.retrieve(batch.id)
        time.sleep(0.05)
    output = client.files.content(batch.output_file_id).content if batch.output_file_id else None
    return {"batch": batch, "output": output}


async def test_openai_sdk_runs_a_batch_over_https_trusting_the_test_ca(
    tmp_path: Path, upstream: tuple[DemoProvider, str], gateways: list[Served]
) -> None:
    """The openai SDK with its default settings and an httpx client trusting the test CA
    uploads, creates, polls and downloads a batch through the TLS agent listener; the same
    SDK without the CA refuses the gateway's certificate (it is TLS, verified)."""
    ca = TestCA(tmp_path / "ca")
    served = https_gateway(tmp_path / "gw", upstream[1], ca.issue("server"))
    gateways.append(served)
    await started(served)
    base = f"https://127.0.0.1:{served.port}/p/openai-batch/v1"
    http = openai.DefaultHttpxClient(verify=ssl.create_default_context(cafile=str(ca.cert)))
    client = openai.OpenAI(base_url=base, api_key=AGENT_TOKEN, http_client=http)
    done = await asyncio.to_thread(run_batch, client)
    batch = done["batch"]
    assert batch.status == "completed" and batch.output_file_id == output_file(batch.id)
    assert done["output"] is not None and b"request-1" in done["output"]
    untrusting = openai.OpenAI(base_url=base, api_key=AGENT_TOKEN, max_retries=0)
    with pytest.raises(openai.APIConnectionError):
        await asyncio.to_thread(untrusting.batches.retrieve, batch.id)
    assert "Traceback" not in served.stop()


# -- requests and curl ----------------------------------------------------------------------


def submit_and_poll_with_requests(port: int, ca: Path) -> tuple[str, list[str]]:
    """A demo job submitted and polled to its end with ``requests`` trusting ``ca``: its
    id and the provider states seen."""
    jobs = f"https://127.0.0.1:{port}/p/demo-jobs/v1/jobs"
    auth = {"Authorization": f"Bearer {AGENT_TOKEN}"}
    with requests.Session() as session:  # verify per call: REQUESTS_CA_BUNDLE beats session.verify
        body = {"demo_script": [{"state": "running"}, {"state": "succeeded"}]}
        answer = session.post(
            jobs,
            json=body,
            headers={**auth, "Idempotency-Key": "tls-1"},
            verify=str(ca),
            timeout=30,
        )
        assert answer.status_code == 202, answer.text
        job = answer.json()["id"]
        assert answer.json()["status_url"].startswith(f"https://127.0.0.1:{port}/p/demo-jobs/")
        states: list[str] = []
        while not states or states[-1] != "succeeded":
            assert len(states) < 20, states
            polled = session.get(
                f"{jobs}/{job}", headers={**auth, "Prefer": "wait=10"}, verify=str(ca), timeout=30
            )
            assert polled.status_code == 200, polled.text
            states.append(polled.json()["state"])
    return job, states


def curl(*args: str) -> subprocess.CompletedProcess[str]:
    command = ["curl", "-sS", "--max-time", "30", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


async def test_requests_and_curl_submit_and_poll_over_https(
    tmp_path: Path, upstream: tuple[DemoProvider, str], gateways: list[Served]
) -> None:
    """``requests`` and ``curl --cacert`` submit a demo job and poll it to its end through
    the lane over TLS (the status URL handed back is https); curl without the CA, and plain
    HTTP on the TLS port, get nothing from the gateway; the image's HEALTHCHECK passes; the
    log has no warning about a TLS transport kept half-open."""
    if shutil.which("curl") is None:
        pytest.skip("curl is not on PATH")
    ca = TestCA(tmp_path / "ca")
    served = https_gateway(tmp_path / "gw", upstream[1], ca.issue("server"))
    gateways.append(served)
    await started(served)
    _, states = await asyncio.to_thread(submit_and_poll_with_requests, served.port, ca.cert)
    assert states[-1] == "succeeded"

    jobs = f"https://127.0.0.1:{served.port}/p/demo-jobs/v1/jobs"
    auth = f"Authorization: Bearer {AGENT_TOKEN}"
    body = json.dumps({"demo_script": [{"state": "succeeded"}]})
    submit = await asyncio.to_thread(
        curl, "--cacert", str(ca.cert), "-H", auth, "-H", "Idempotency-Key: tls-curl",
        "-H", "Content-Type: application/json", "-d", body, "-w", "\n%{http_code}", jobs,
    )  # fmt: skip
    text, code = submit.stdout.rsplit("\n", 1)
    assert code == "202", submit.stdout + submit.stderr
    job = json.loads(text)["id"]
    polled = await asyncio.to_thread(
        curl, "--cacert", str(ca.cert), "-H", auth, "-H", "Prefer: wait=10",
        "-w", "\n%{http_code}", f"{jobs}/{job}",
    )  # fmt: skip
    text, code = polled.stdout.rsplit("\n", 1)
    assert code == "200" and json.loads(text)["state"] == "succeeded", polled.stdout

    untrusted = await asyncio.to_thread(curl, f"https://127.0.0.1:{served.port}/healthz")
    assert untrusted.returncode == 60, untrusted.stderr  # the peer's certificate is not trusted
    plain = await asyncio.to_thread(curl, f"http://127.0.0.1:{served.port}/healthz")
    assert plain.returncode != 0 and not plain.stdout
    healthz = await asyncio.to_thread(
        curl, "--cacert", str(ca.cert), f"https://localhost:{served.port}/healthz"
    )
    assert json.loads(healthz.stdout) == {"status": "ok"}  # aiohttp's routes, relayed
    assert (await asyncio.to_thread(healthcheck, served.config, {})).returncode == 0
    stderr = served.stop()
    assert "Traceback" not in stderr
    assert "eof_received" not in stderr  # no half-close asked of a TLS transport


def healthcheck(config: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The image's HEALTHCHECK script run against ``config``."""
    return subprocess.run(
        [sys.executable, str(ROOT / "deploy" / "docker" / "healthcheck.py")],
        env={**os.environ, **PROVIDER_ENV, "STATUSGATE_CONFIG": str(config), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_image_healthcheck_speaks_tls_and_presents_a_client_certificate(
    tmp_path: Path, upstream: tuple[DemoProvider, str], gateways: list[Served]
) -> None:
    """Against an agent listener that requires client certificates, the image's
    HEALTHCHECK says which variables to set, and passes once they name a certificate of
    the client CA."""
    ca = TestCA(tmp_path / "ca")
    served = https_gateway(tmp_path / "gw", upstream[1], ca.issue("server"))
    data = yaml.safe_load(served.config.read_text())
    data["listen"]["tls"]["client_ca_file"] = str(ca.cert)
    served.config.write_text(yaml.safe_dump(data))
    gateways.append(served)
    await started(served)
    bare = await asyncio.to_thread(healthcheck, served.config, {})
    assert bare.returncode == 1
    assert "set STATUSGATE_HEALTHCHECK_CERT and STATUSGATE_HEALTHCHECK_KEY" in bare.stderr
    probe = ca.issue("probe", client=True)
    env = {
        "STATUSGATE_HEALTHCHECK_CERT": str(probe.cert),
        "STATUSGATE_HEALTHCHECK_KEY": str(probe.key),
    }
    passed = await asyncio.to_thread(healthcheck, served.config, env)
    assert passed.returncode == 0, passed.stderr
    assert "Traceback" not in served.stop()


# -- client certificates --------------------------------------------------------------------


def admin_get(port: int, ca: Path, cert: Issued | None) -> requests.Response:
    return requests.get(
        f"https://127.0.0.1:{port}/admin/escalations",
        headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"},
        verify=str(ca),
        cert=(str(cert.cert), str(cert.key)) if cert is not None else None,
        timeout=30,
    )


async def test_client_certificates_are_required_on_the_admin_listener(
    tmp_path: Path, upstream: tuple[DemoProvider, str], gateways: list[Served]
) -> None:
    """With admin_listen.tls.client_ca_file, an operator's call with a certificate of that
    CA is answered; one without a certificate, or with one of another CA, is refused in
    the handshake, whatever its bearer token; the agent listener asks for none."""
    ca, other = TestCA(tmp_path / "ca"), TestCA(tmp_path / "other", name="Other CA")
    port = free_port()
    served = https_gateway(
        tmp_path / "gw", upstream[1], ca.issue("server"), admin_ca=ca, admin_port=port
    )
    gateways.append(served)
    process = (await started(served)).process
    assert process is not None
    await asyncio.to_thread(wait_until_up, port, process)
    answered = await asyncio.to_thread(admin_get, port, ca.cert, ca.issue("alice", client=True))
    assert answered.status_code == 200, answered.text
    mallory = other.issue("mallory", client=True)
    for cert in (None, mallory):
        with pytest.raises(requests.exceptions.ConnectionError):
            await asyncio.to_thread(admin_get, port, ca.cert, cert)
    print(
        "refusals:", [await asyncio.to_thread(refusal, port, ca.cert, c) for c in (None, mallory)]
    )
    agent = await asyncio.to_thread(
        requests.get, f"https://127.0.0.1:{served.port}/healthz", verify=str(ca.cert), timeout=30
    )
    assert agent.status_code == 200
    assert "Traceback" not in served.stop()


def refusal(port: int, ca: Path, cert: Issued | None) -> bytes | str:
    """What a raw TLS client presenting ``cert`` reads after its first request: the
    answer's bytes, or the TLS alert that ended the connection."""
    context = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        context.load_cert_chain(cert.cert, cert.key)
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        try:
            tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            return tls.recv(1024)
        except ssl.SSLError as exc:
            return str(exc.reason)


# -- reload ---------------------------------------------------------------------------------


async def wait_for_serial(port: int, ca: Path, wanted: int) -> int:
    """The served serial once it is ``wanted`` (or the last seen after 30 s)."""
    seen = 0
    for _ in range(300):
        seen = await asyncio.to_thread(served_serial, port, ca)
        if seen == wanted:
            break
        await asyncio.sleep(0.1)
    return seen


async def test_sighup_serves_a_rotated_certificate_and_keeps_it_when_the_next_is_bad(
    tmp_path: Path, upstream: tuple[DemoProvider, str], gateways: list[Served]
) -> None:
    """Certificate files replaced on disk are served to new connections after SIGHUP
    (the served serial changes, no restart); then a key that does not match its
    certificate refuses the reload with an error naming listen.tls.key_file, and the
    rotated certificate is still the one served."""
    ca = TestCA(tmp_path / "ca")
    first, second = ca.issue("first"), ca.issue("second")
    live = Issued(tmp_path / "live.pem", tmp_path / "live.key", first.serial)
    shutil.copy(first.cert, live.cert)
    shutil.copy(first.key, live.key)
    served = https_gateway(tmp_path / "gw", upstream[1], live)
    gateways.append(served)
    process = (await started(served)).process
    assert process is not None
    assert await asyncio.to_thread(served_serial, served.port, ca.cert) == first.serial

    shutil.copy(second.cert, live.cert)
    shutil.copy(second.key, live.key)
    assert await asyncio.to_thread(served_serial, served.port, ca.cert) == first.serial
    process.send_signal(signal.SIGHUP)
    assert await wait_for_serial(served.port, ca.cert, second.serial) == second.serial

    shutil.copy(first.key, live.key)  # the second certificate with the first one's key
    process.send_signal(signal.SIGHUP)
    _, states = await asyncio.to_thread(submit_and_poll_with_requests, served.port, ca.cert)
    assert states[-1] == "succeeded"  # served all along
    assert await asyncio.to_thread(served_serial, served.port, ca.cert) == second.serial
    stderr = served.stop()
    lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    events = [line["event"] for line in lines]
    assert (
        "TLS files re-read (listen.tls): new connections get the certificates now in them" in events
    )
    refused = [e for e in events if e.startswith("config reload: ")]
    assert refused == [
        f"config reload: {served.config}: listen.tls.key_file: {live.key} is not the private"
        " key of the certificate in cert_file"
    ]
    assert "Traceback" not in stderr

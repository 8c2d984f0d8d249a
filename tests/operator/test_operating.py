"""Operating it in production (SPEC 13), against real `statusgate serve` processes: request
logs joined to audit lines by request id, live reload, the admin listener, complete metrics,
signed webhooks, the version, and what a second start on a taken port says."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer
from standardwebhooks.webhooks import Webhook

from gateway import __version__
from gateway.demo.provider import DemoProvider
from gateway.observe.audit import read_lines, verify
from gateway.observe.metrics import FLUSH_SECONDS

from conftest import AGENT_TOKEN, OPERATOR_TOKEN, PROVIDER_ENV, PROVIDER_KEY, Served, free_port

AUTH = {"Authorization": f"Bearer {AGENT_TOKEN}"}
OPS = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
SECRET = "whsec_" + base64.b64encode(b"a-webhook-secret-of-32-bytes-ok!").decode()


def log_lines(stderr: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


async def submit(http: aiohttp.ClientSession, base: str, **headers: str) -> aiohttp.ClientResponse:
    body = {"input": "x", "demo_script": [{"state": "running"}]}
    async with http.post(
        f"{base}/p/demo-jobs/v1/jobs?secret=q", json=body, headers={**AUTH, **headers}
    ) as response:
        await response.read()
        return response


async def test_one_log_line_per_request_joined_to_its_audit_line_by_request_id(
    tmp_path: Path, upstream: tuple[DemoProvider, str], gateways: list[Served]
) -> None:
    """JSON lines on stderr: each request gives one line with the SPEC 13 fields; a sent
    X-Request-Id is kept, echoed and written on the audit line; a bad one is replaced;
    no query string or token reaches the log."""
    _, url = upstream
    served = await Served(tmp_path, url, tmp_path / "g.db").up()
    gateways.append(served)
    base = f"http://127.0.0.1:{served.port}"
    async with aiohttp.ClientSession() as http:
        kept = await submit(
            http, base, **{"X-Request-Id": "agent-run-7.step-1", "Idempotency-Key": "a"}
        )
        made = await submit(http, base, **{"X-Request-Id": "bad id!", "Idempotency-Key": "b"})
    assert kept.headers["X-Request-Id"] == "agent-run-7.step-1"
    assert made.headers["X-Request-Id"] != "bad id!" and len(made.headers["X-Request-Id"]) >= 16
    stderr = served.stop()
    requests = [line for line in log_lines(stderr) if line.get("event") == "request"]
    assert len(requests) == 2
    line = next(r for r in requests if r["request_id"] == "agent-run-7.step-1")
    expected = {
        "method": "POST",
        "path": "/p/demo-jobs/v1/jobs",
        "status": 202,
        "account": "team-a",
        "provider": "demo-jobs",
        "operation_id": kept.headers["Statusgate-Operation"],
        "outcome": "pending",
        "provider_status": 202,
        "level": "info",
    }
    assert {k: line[k] for k in expected} == expected
    assert line["duration_ms"] > 0 and line["provider_ms"] > 0 and line["ts"].endswith("Z")
    audit = [a for a in served.audit() if a.get("request_id") == "agent-run-7.step-1"]
    assert [a["event"] for a in audit] == ["submitted"]
    assert audit[0]["operation_id"] == line["operation_id"]
    for secret in ("secret=q", AGENT_TOKEN, PROVIDER_KEY):
        assert secret not in stderr


async def test_text_logs_and_the_level_switch(
    tmp_path: Path, upstream: tuple[DemoProvider, str], gateways: list[Served]
) -> None:
    """``logging: {format: text, level: warning}``: no request lines at info, text lines."""
    _, url = upstream
    config = {"logging": {"format": "text", "level": "warning"}}
    served = await Served(tmp_path, url, tmp_path / "g.db", config=config).up()
    gateways.append(served)
    async with aiohttp.ClientSession() as http:
        await submit(http, f"http://127.0.0.1:{served.port}", **{"Idempotency-Key": "a"})
    stderr = served.stop()
    assert "request" not in stderr and not log_lines(stderr)


def write_policy_change(served: Served, **polling: Any) -> None:
    path = served.folder / "policies" / "demo-jobs.yaml"
    data = yaml.safe_load(path.read_text())
    data["polling"].update(polling)
    path.write_text(yaml.safe_dump(data))


async def test_sighup_and_admin_reload_apply_valid_sets_and_refuse_invalid_ones(
    tmp_path: Path, upstream: tuple[DemoProvider, str], gateways: list[Served]
) -> None:
    """A valid change applies on SIGHUP (the next operation gets the new budget); an invalid
    policy or a changed store is refused whole with check's messages and the old set keeps
    serving; POST /admin/reload says the same with 422; both are counted."""
    _, url = upstream
    served = await Served(tmp_path, url, tmp_path / "g.db").up()
    gateways.append(served)
    base = f"http://127.0.0.1:{served.port}"
    async with aiohttp.ClientSession() as http:
        first = await submit(http, base, **{"Idempotency-Key": "a"})
        assert first.headers["Statusgate-Requests-Remaining"] == "12"
        write_policy_change(served, max_status_requests=5)
        assert served.process is not None
        served.process.send_signal(signal.SIGHUP)
        for _ in range(50):  # the reload runs in the gateway's loop
            second = await submit(http, base, **{"Idempotency-Key": f"b{_}"})
            if second.headers["Statusgate-Requests-Remaining"] == "5":
                break
            await asyncio.sleep(0.05)
        assert second.headers["Statusgate-Requests-Remaining"] == "5"
        write_policy_change(served, base_delay="soon")
        async with http.post(f"{base}/admin/reload", headers=OPS) as refused:
            body = await refused.json()
        assert refused.status == 422 and body["type"] == "/problems/config-rejected"
        assert any("polling.base_delay: must be a duration" in p for p in body["problems"])
        write_policy_change(served, base_delay="1s")
        config = yaml.safe_load(served.config.read_text())
        config["store"] = "memory://"
        served.config.write_text(yaml.safe_dump(config))
        async with http.post(f"{base}/admin/reload", headers=OPS) as refused:
            body = await refused.json()
        assert any(
            p.endswith("store: cannot change while the gateway runs; restart it to apply")
            for p in body["problems"]
        )
        third = await submit(http, base, **{"Idempotency-Key": "c"})
        assert third.status == 202 and third.headers["Statusgate-Requests-Remaining"] == "5"
        async with http.post(f"{base}/admin/reload", headers=AUTH) as agent:
            assert agent.status == 403
        async with http.get(f"{base}/metrics") as metrics:
            text = await metrics.text()
    assert 'statusgate_config_reloads_total{result="ok"} 1.0' in text
    assert 'statusgate_config_reloads_total{result="error"} 2.0' in text
    stderr = served.stop()
    assert "Traceback" not in stderr


async def test_admin_listener_keeps_operators_and_agents_apart(
    tmp_path: Path, upstream: tuple[DemoProvider, str], gateways: list[Served]
) -> None:
    """With admin_listen, /admin and /metrics answer only there, /p/ only on the agent
    listener, /healthz on both."""
    _, url = upstream
    admin_port = free_port()
    config = {"admin_listen": {"host": "127.0.0.1", "port": admin_port}}
    served = await Served(tmp_path, url, tmp_path / "g.db", config=config).up()
    gateways.append(served)
    agent, admin = f"http://127.0.0.1:{served.port}", f"http://127.0.0.1:{admin_port}"
    async with aiohttp.ClientSession() as http:
        for base, path, status in [
            (agent, "/admin/operations", 404),
            (agent, "/metrics", 404),
            (admin, "/admin/operations", 200),
            (admin, "/metrics", 200),
            (admin, "/p/demo-jobs/v1/jobs/x", 404),
            (agent, "/p/demo-jobs/v1/jobs/x", 404),
            (agent, "/healthz", 200),
            (admin, "/healthz", 200),
        ]:
            async with http.get(base + path, headers={**OPS} if "admin" in path else AUTH) as r:
                assert r.status == status, (base, path)
                if base == admin and path.startswith("/p/"):
                    assert (await r.json())["type"] == "/problems/route-not-allowed"
        async with http.get(f"{agent}/p/demo-jobs/v1/jobs/x", headers=AUTH) as r:
            assert (await r.json())["type"] == "/problems/unknown-operation"


async def test_metrics_exist_from_the_start(
    tmp_path: Path, upstream: tuple[DemoProvider, str], gateways: list[Served]
) -> None:
    """Before any traffic every provider's series read 0; build info, process metrics and
    the open-escalations gauge are there."""
    _, url = upstream
    served = await Served(tmp_path, url, tmp_path / "g.db").up()
    gateways.append(served)
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{served.port}/metrics") as response,
    ):
        text = await response.text()
    for series in [
        'statusgate_agent_requests_total{outcome="provider-unavailable",provider="batch-api",'
        'route="status"} 0.0',
        'statusgate_upstream_requests_total{provider="demo-jobs",route="status",'
        'status_class="5xx"} 0.0',
        'statusgate_escalations_total{provider="azure-read",reason="authorization_denied"} 0.0',
        'statusgate_escalations_open{provider="demo-jobs",reason="deadline_exceeded"} 0.0',
        'statusgate_operations_finished_total{outcome="abandoned",provider="demo-jobs"} 0.0',
        'statusgate_webhook_deliveries_total{result="failed"} 0.0',
        f'statusgate_build_info{{version="{__version__}"}} 1.0',
        "process_resident_memory_bytes",
    ]:
        assert series in text, series


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[list[dict[str, Any]], str]]:
    """A webhook receiver that verifies every delivery with the standardwebhooks package."""
    verified: list[dict[str, Any]] = []
    webhook = Webhook(SECRET)

    async def receive(request: web.Request) -> web.Response:
        body = await request.read()
        verified.append(webhook.verify(body, dict(request.headers)))
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/hook", receive)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield verified, str(server.make_url("/hook"))
    await server.close()


async def test_webhooks_are_signed_for_escalations_and_decisions(
    tmp_path: Path,
    upstream: tuple[DemoProvider, str],
    gateways: list[Served],
    receiver: tuple[list[dict[str, Any]], str],
) -> None:
    """Standard Webhooks signatures that the reference package verifies, for
    operation.escalated and operation.decided; deliveries are counted."""
    verified, hook = receiver
    _, url = upstream
    config = {"escalation": {"webhook_url": hook, "webhook_secret_env": "HOOK_SECRET"}}
    os.environ["HOOK_SECRET"] = SECRET
    try:
        served = Served(tmp_path, url, tmp_path / "g.db", config=config)
        await served.up()
    finally:
        del os.environ["HOOK_SECRET"]
    gateways.append(served)
    base = f"http://127.0.0.1:{served.port}"
    async with aiohttp.ClientSession() as http:
        body = {"input": "x", "demo_script": [{"state": "mystery"}]}
        headers = {**AUTH, "Idempotency-Key": "w"}
        async with http.post(f"{base}/p/demo-jobs/v1/jobs", json=body, headers=headers) as r:
            operation, job = r.headers["Statusgate-Operation"], (await r.json())["id"]
        await asyncio.sleep(1.1)
        async with http.get(f"{base}/p/demo-jobs/v1/jobs/{job}", headers=AUTH) as r:
            assert (await r.json())["reason"] == "unknown_state"
        async with http.post(
            f"{base}/admin/operations/{operation}/abandon", json={"reason": "x"}, headers=OPS
        ) as r:
            assert r.status == 200
        for _ in range(100):
            if len(verified) >= 2:
                break
            await asyncio.sleep(0.05)
        async with http.get(f"{base}/metrics") as r:
            metrics = await r.text()
    assert [v["type"] for v in verified] == ["operation.escalated", "operation.decided"]
    assert verified[1]["action"] == "abandon" and verified[1]["actor"] == "alice"
    assert all(v["operation_id"] == operation for v in verified)
    assert 'statusgate_webhook_deliveries_total{result="delivered"} 2.0' in metrics
    assert SECRET not in served.stop()


def test_version_check_collects_every_problem_and_env_defaults(tmp_path: Path) -> None:
    """``--version``; a config error and two policy errors in one check run; a variable
    with a default needs no environment."""
    version = subprocess.run(
        [sys.executable, "-m", "gateway.run", "--version"], capture_output=True, check=False
    )
    assert version.stdout.decode().strip() == f"statusgate {__version__}"
    (tmp_path / "policies").mkdir()
    policy = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "policies/demo-jobs.yaml").read_text()
    )
    policy["credential"]["value"] = "Bearer ${DEMO_KEY:-fallback-key}"
    (tmp_path / "policies" / "good.yaml").write_text(yaml.safe_dump(policy))
    bad = {**policy, "provider": "bad", "polling": {"base_delay": "soon", "jitter": {"min": 2}}}
    (tmp_path / "policies" / "bad.yaml").write_text(yaml.safe_dump(bad))
    (tmp_path / "gateway.yaml").write_text(
        yaml.safe_dump({"policies_dir": "policies", "listen": {"port": "eighty"}})
    )
    check = subprocess.run(
        [sys.executable, "-m", "gateway.run", "check", "--config", str(tmp_path / "gateway.yaml")],
        capture_output=True,
        check=False,
        env={k: v for k, v in os.environ.items() if k != "DEMO_KEY"},
    )
    lines = check.stderr.decode().splitlines()
    assert check.returncode == 1
    assert any("gateway.yaml: listen.port:" in line for line in lines), lines
    assert any("bad.yaml: polling.base_delay:" in line for line in lines), lines
    assert any("bad.yaml: polling.jitter.min:" in line for line in lines), lines
    assert not any("good.yaml" in line for line in lines), lines


async def test_a_second_start_on_a_taken_port_is_one_line(
    tmp_path: Path, upstream: tuple[DemoProvider, str], gateways: list[Served]
) -> None:
    """The port is named in one line on stderr (JSON, as the log format says), exit 1, no
    traceback; the running gateway's own start-up lines on stderr are JSON too."""
    _, url = upstream
    first = await Served(tmp_path / "a", url, tmp_path / "a.db").up()
    gateways.append(first)
    second = Served(tmp_path / "b", url, tmp_path / "b.db", config={"listen": {"port": first.port}})
    process = second.start()
    code = await asyncio.to_thread(process.wait, 20)
    stderr = process.stderr.read().decode() if process.stderr else ""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1, stderr
    line = json.loads(lines[0])
    assert line["level"] == "error"
    assert line["event"].startswith(
        f"statusgate serve: cannot listen on 127.0.0.1:{first.port} (agent):"
    )
    started = [json.loads(line) for line in first.stop().splitlines() if line.strip()]
    listening = [line for line in started if line.get("listener") == "agent"]
    assert listening and listening[0]["url"] == f"http://127.0.0.1:{first.port}"


def test_make_run_on_a_taken_port_says_so_and_starts_nothing() -> None:
    """A second `make run` (port 8080 taken) says so in one line and leaves nothing running."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".venv" / ".installed-dev").exists():
        pytest.skip("make run needs the project's .venv (make test builds it)")
    taken = socket.socket()
    try:
        taken.bind(("127.0.0.1", 8080))
    except OSError:
        pytest.skip("127.0.0.1:8080 is in use on this machine; cannot stage a second make run")
    taken.listen()
    try:
        env = {**os.environ, "DEMO_API_KEY": "k"}
        done = subprocess.run(
            ["make", "-s", "run"], cwd=root, capture_output=True, timeout=60, env=env, check=False
        )
    finally:
        taken.close()
    output = (done.stdout + done.stderr).decode()
    ours = [line for line in output.splitlines() if line.startswith("make run:")]
    assert done.returncode != 0
    assert ours == [
        "make run: 127.0.0.1:8080 is already in use (another make run?); nothing was started"
    ]
    assert "Traceback" not in output
    probe = socket.socket()
    assert probe.connect_ex(("127.0.0.1", 8081)) != 0  # no demo provider was left running
    probe.close()


async def test_workers_share_one_port_on_redis_and_are_refused_elsewhere(
    tmp_path: Path,
    upstream: tuple[DemoProvider, str],
    gateways: list[Served],
    redis_url: str,
) -> None:
    """``--workers 2`` on Redis: both processes answer on one port, metrics merge both
    workers' counts (each worker's reach the shared files within FLUSH_SECONDS, whichever
    worker a scrape lands on); on SQLite the command is refused in one line."""
    _, url = upstream
    served = Served(
        tmp_path / "r", url, tmp_path / "unused.db", store_url=redis_url, args=["--workers", "2"]
    )
    await served.up()
    gateways.append(served)
    base = f"http://127.0.0.1:{served.port}"
    merged = 'statusgate_operations_started_total{provider="demo-jobs"} 40.0'
    connector = aiohttp.TCPConnector(force_close=True)  # a connection each: both workers serve
    async with aiohttp.ClientSession(connector=connector) as http:
        for n in range(40):
            headers = {**AUTH, "Idempotency-Key": f"w{n}"}
            async with http.post(f"{base}/p/demo-jobs/v1/jobs", json={}, headers=headers) as r:
                assert r.status == 202
        await asyncio.sleep(2 * FLUSH_SECONDS)
        async with http.get(f"{base}/metrics") as r:  # one scrape: one worker flushes at it
            text = await r.text()
    assert merged in text
    stderr = served.stop()
    assert "Traceback" not in stderr
    audit = served.folder / "audit.jsonl"
    assert verify(read_lines(audit), None).intact  # both workers wrote one chain
    assert sum(1 for line in served.audit() if line["event"] == "submitted") == 40
    sqlite = Served(tmp_path / "s", url, tmp_path / "s.db").config
    refused = subprocess.run(
        [sys.executable, "-m", "gateway.run", "serve", "--workers", "2", "--config", str(sqlite)],
        capture_output=True,
        timeout=30,
        check=False,
        env={**os.environ, **PROVIDER_ENV},
    )
    assert refused.returncode == 1
    assert json.loads(refused.stderr.decode())["event"] == (
        "statusgate serve: --workers 2 needs a shared store (store: redis://... or "
        "postgresql://...); the sqlite store is owned by one process"
    )


async def test_a_mounted_secret_file_is_read_again_on_reload_and_never_logged(
    tmp_path: Path, upstream: tuple[DemoProvider, str], gateways: list[Served]
) -> None:
    """``${file:/path}`` in a policy: a rotated secret file is used after POST /admin/reload
    (a wrong key before it, the right one after), and neither value reaches the log."""
    _, url = upstream
    secret = tmp_path / "demo-key"
    secret.write_text("wrong-key-7d1c\n")
    credential = {"header": "Authorization", "value": f"Bearer ${{file:{secret}}}"}
    served = await Served(
        tmp_path, url, tmp_path / "g.db", policy_changes={"demo-jobs": {"credential": credential}}
    ).up()
    gateways.append(served)
    base = f"http://127.0.0.1:{served.port}"
    async with aiohttp.ClientSession() as http:
        refused = await submit(http, base, **{"Idempotency-Key": "a"})
        assert refused.status == 502, await refused.text()
        secret.write_text(PROVIDER_KEY + "\n")
        async with http.post(f"{base}/admin/reload", headers=OPS) as reloaded:
            assert reloaded.status == 200, await reloaded.text()
        accepted = await submit(http, base, **{"Idempotency-Key": "b"})
        assert accepted.status == 202, await accepted.text()
    stderr = served.stop()
    assert "wrong-key-7d1c" not in stderr and PROVIDER_KEY not in stderr
    assert "wrong-key-7d1c" not in (tmp_path / "audit.jsonl").read_text()

"""A provider value of any size: bounded where the gateway keeps it (records, audit lines,
escalations, the console), and a start never fails on a line the gateway wrote."""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

from gateway.core import decide, effects
from gateway.core.escalation import message
from gateway.core.models import Event, ProviderAnswer, Reason
from gateway.core.values import MAX_VALUE, bounded
from gateway.demo.provider import DemoProvider
from gateway.observe.audit import TAIL_BYTES, AuditLog, Fsync, canonical_json
from gateway.settings.policy import load_policy

from conftest import AGENT_TOKEN, OPERATOR_TOKEN, ROOT, Served, pending_record

HUGE = "S" * 1_200_000  # an unknown state of 1.2 MB, as the probe sent
DIGEST = hashlib.sha256(HUGE.encode()).hexdigest()


def test_bounded_keeps_short_values_and_marks_long_ones_with_size_and_hash() -> None:
    """A value within MAX_VALUE bytes is kept as it is; a longer one is cut to at most
    MAX_VALUE bytes with a marker naming its size and SHA-256, and stays so if bounded
    again."""
    assert bounded("running") == "running"
    cut = bounded(HUGE)
    assert len(cut.encode()) <= MAX_VALUE
    assert cut.startswith("SSS") and f"truncated: 1200000 bytes, sha256 {DIGEST}" in cut
    assert bounded(cut) == cut
    wide = bounded("é" * 1000)  # never half a character
    assert len(wide.encode()) <= MAX_VALUE and "2000 bytes" in wide
    assert bounded("\ud800") == "?"  # a lone surrogate a JSON string may hold


def test_an_unknown_state_of_any_size_is_recorded_escalated_and_audited_bounded() -> None:
    """A 1.2 MB unknown state escalates unknown_state with the record's state, the
    escalation's detail and message, and the audit line all bounded."""
    policy = load_policy(ROOT / "policies/demo-jobs.yaml", "demo-jobs.yaml", {"DEMO_API_KEY": "k"})
    now = time.time()
    body = json.dumps({"id": "job_1", "state": HUGE}).encode()
    answer = ProviderAnswer(200, body, "application/json")
    decision = decide.classify(policy, pending_record(), answer, now, 0.5)
    record = decision.record
    assert record.escalation is not None
    assert record.escalation.reason is Reason.UNKNOWN_STATE
    assert record.last_known_state == bounded(HUGE)
    assert len(record.escalation.detail.encode()) < 1024
    assert len(message(record, policy).encode()) < 4096
    found = effects.of_decision(policy, decision, now, event=Event.ESCALATED, http_status=200)
    line = next(e for e in found if isinstance(e, effects.Line))
    assert len(canonical_json(dict(line.fields))) < 4096


def test_writer_continues_a_chain_whose_last_line_is_longer_than_its_read_back(
    tmp_path: Path,
) -> None:
    """A last line longer than the writer reads at once (one an older version wrote), and
    a torn tail after it longer still, never stop the writer from continuing the chain."""

    async def scenario() -> None:
        path = tmp_path / "audit.jsonl"
        first = AuditLog(path, key=None, fsync=Fsync.NEVER)
        await first.append({"event": "submitted"})
        await first.append({"event": "escalated", "provider_state": "x" * (TAIL_BYTES + 5)})
        await first.close()
        with path.open("ab") as handle:
            handle.write(b'{"seq": 3, "torn": "' + b"y" * (TAIL_BYTES + 7))
        second = AuditLog(path, key=None, fsync=Fsync.NEVER)
        second.open()
        await second.append({"event": "resumed"})
        await second.close()

    asyncio.run(scenario())
    path = tmp_path / "audit.jsonl"
    run = subprocess.run(
        [sys.executable, "-m", "gateway.run", "audit", "verify", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "3 records, chain intact" in run.stdout
    torn = list(tmp_path.glob("audit.jsonl.torn-*"))
    assert len(torn) == 1 and torn[0].stat().st_size == TAIL_BYTES + 27


async def test_a_served_gateway_bounds_a_huge_state_and_restarts(
    tmp_path: Path, upstream: tuple[DemoProvider, str], gateways: list[Served]
) -> None:
    """`statusgate serve` facing a 1.2 MB unknown state escalates it with bounded values in
    the audit line and the operator's view, and starts again on its own audit file."""
    demo, url = upstream
    demo.default_scripts["jobs"] = [{"state": HUGE}]
    config = {"limits": {"max_response_body": "4MiB"}}
    polling = {"demo-jobs": {"polling": {"base_delay": "50ms", "jitter": {"min": 1, "max": 1}}}}
    served = Served(tmp_path, url, tmp_path / "g.db", config=config, policy_changes=polling)
    gateways.append(await served.up())
    base = f"http://127.0.0.1:{served.port}"
    agent = {"Authorization": f"Bearer {AGENT_TOKEN}"}
    async with aiohttp.ClientSession() as http:
        submitted = await http.post(
            f"{base}/p/demo-jobs/v1/jobs",
            json={"input": "report.pdf"},
            headers={**agent, "Idempotency-Key": "a"},
        )
        assert submitted.status == 202, await submitted.text()
        job = (await submitted.json())["id"]
        operation = submitted.headers["Statusgate-Operation"]
        escalated = await http.get(
            f"{base}/p/demo-jobs/v1/jobs/{job}", headers={**agent, "Prefer": "wait=5"}
        )
        assert escalated.status == 409, await escalated.text()
        assert len(await escalated.read()) < 8192
        operator = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
        async with http.get(f"{base}/admin/operations/{operation}", headers=operator) as shown:
            view = await shown.read()
        assert len(view) < 32768 and DIGEST.encode() in view
    served.stop()
    audit = (tmp_path / "audit.jsonl").read_bytes()
    assert max(len(line) for line in audit.splitlines()) < 4096
    assert f"1200000 bytes, sha256 {DIGEST}".encode() in audit
    await served.up()  # a restart on the same audit file
    async with aiohttp.ClientSession() as http:
        again = await http.post(
            f"{base}/p/demo-jobs/v1/jobs",
            json={"input": "report.pdf"},
            headers={**agent, "Idempotency-Key": "b"},
        )
        assert again.status == 202
    assert "Traceback" not in served.stop()


async def test_a_served_gateway_starts_on_an_audit_line_longer_than_its_read_back(
    tmp_path: Path, upstream: tuple[DemoProvider, str], gateways: list[Served]
) -> None:
    """`statusgate serve` starts and continues the chain on an audit file whose last line
    (as an older version wrote a huge provider value) is longer than it reads at once."""
    _, url = upstream
    path = tmp_path / "audit.jsonl"
    old = AuditLog(path, key=None, fsync=Fsync.NEVER)
    await old.append({"event": "escalated", "provider_state": "S" * (TAIL_BYTES + 200_000)})
    await old.close()
    served = Served(tmp_path, url, tmp_path / "g.db")
    gateways.append(await served.up())
    async with aiohttp.ClientSession() as http:
        submitted = await http.post(
            f"http://127.0.0.1:{served.port}/p/demo-jobs/v1/jobs",
            json={"input": "report.pdf"},
            headers={"Authorization": f"Bearer {AGENT_TOKEN}", "Idempotency-Key": "a"},
        )
        assert submitted.status == 202
    assert "Traceback" not in served.stop()
    run = subprocess.run(
        [sys.executable, "-m", "gateway.run", "audit", "verify", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0 and "2 records, chain intact" in run.stdout, run.stdout

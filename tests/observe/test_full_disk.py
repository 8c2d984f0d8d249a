"""A full disk under the audit log: lines whole or not at all, no new work while a line
cannot be written, and service back by itself, chain intact, when space returns."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.demo.provider import DemoProvider
from gateway.observe.audit import AuditLog, Fsync, read_lines, verify

from conftest import AGENT_TOKEN, OPERATOR_TOKEN, Served


class SmallDisk:
    """A 1 MiB tmpfs the test can fill and free again."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.filler = path / f"filler-{uuid.uuid4().hex}"

    def fill(self) -> None:
        """Take every free byte (a write on it then stops short or fails with ENOSPC)."""
        with self.filler.open("ab", buffering=0) as handle, contextlib.suppress(OSError):
            while handle.write(b"\0" * 4096):
                pass

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[SmallDisk]:
    """A real full disk: a 1 MiB tmpfs, unmounted afterwards. Mounting needs root: without
    it these tests are skipped with the reason, and the RLIMIT_FSIZE test below still
    checks that a line is written whole or not at all."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"full-disk tests need a tmpfs mount: {done.stderr.strip() or 'refused'}")
    try:
        yield SmallDisk(mount)
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


async def test_a_line_cut_short_is_rolled_back_and_written_when_space_returns(
    small_disk: SmallDisk,
) -> None:
    """A write the full disk cuts short is truncated back to the line's start; the line
    (and every line after it) waits, and is written in order, chain intact, once space
    returns."""
    path = small_disk.path / "audit.jsonl"
    audit = AuditLog(path, key=None, fsync=Fsync.NEVER)
    await audit.append({"event": "submitted", "detail": "first"})
    size = path.stat().st_size
    assert size % 4096, "the file's last page must have room for part of a line"
    small_disk.fill()
    assert await audit.append({"event": "polled", "detail": "x" * 6000}) is None
    assert path.stat().st_size == size and path.read_bytes().endswith(b"\n")
    assert await audit.append({"event": "finished"}) is None  # waits behind the first
    assert not audit.writable()
    assert path.stat().st_size == size
    small_disk.free()
    assert audit.writable()
    await audit.close()
    verdict = verify(read_lines(path), None)
    assert verdict.intact and verdict.records == 3
    events = [line.split(b'"event":"')[1].split(b'"')[0] for line in read_lines(path)]
    assert events == [b"submitted", b"polled", b"finished"]


async def test_a_line_refused_after_its_side_effect_waits_and_the_agent_gets_its_job(
    make_harness: Any, small_disk: SmallDisk
) -> None:
    """When the disk fills while a submission is at the provider, the agent still gets its
    job (a retry would pay for it twice), the submitted line waits and is written once space
    returns, and the gateway takes no new work meanwhile."""
    audit_path = small_disk.path / "audit.jsonl"
    harness = await make_harness(config_changes={"audit": {"path": str(audit_path)}})
    slow = {"delay": 0.3}
    submitting = asyncio.create_task(harness.submit([{"state": "running"}], submit=slow))
    while not harness.provider.log:  # the submission reached the provider
        await asyncio.sleep(0.01)
    small_disk.fill()
    answer = await submitting
    assert answer.status == 202, await answer.text()
    job = (await answer.json())["id"]
    assert audit_path.read_bytes() == b""  # its line waits
    assert (await harness.poll_when_due(job)).status == 503
    assert len(harness.provider_calls(job)) == 0
    small_disk.free()
    polled = await harness.poll_when_due(job)
    assert polled.status == 200, await polled.text()
    verdict = verify(read_lines(audit_path), None)
    assert verdict.intact and verdict.records == 2
    assert [line["event"] for line in harness.audit_lines()] == ["submitted", "polled"]


async def test_a_failed_fsync_closes_the_gate_until_one_succeeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``fsync: always``, an fsync the disk fails (ENOSPC or EIO, where a disk says so
    only then) raises nothing into the request but keeps new work out until an fsync
    succeeds."""
    path = tmp_path / "audit.jsonl"
    audit = AuditLog(path, key=None, fsync=Fsync.ALWAYS)
    synced = os.fsync

    def failing(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", failing)
    assert await audit.append({"event": "submitted"}) is not None
    assert not audit.writable()
    monkeypatch.setattr(os, "fsync", synced)
    assert audit.writable()
    await audit.close()
    assert verify(read_lines(path), None).records == 1


LIMITED = """
import asyncio, json, resource, sys
from pathlib import Path
from gateway.observe.audit import AuditLog, Fsync

async def main(path: Path) -> None:
    audit = AuditLog(path, key=None, fsync=Fsync.NEVER)
    await audit.append({"event": "submitted"})
    size = path.stat().st_size
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size + 100, hard))  # 100 bytes more at most
    refused = await audit.append({"event": "polled", "detail": "x" * 1000})
    after = path.stat().st_size
    gate = audit.writable()
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
    reopened = audit.writable()
    await audit.close()
    print(json.dumps({"refused": refused is None, "size": size, "after": after,
                      "gate": gate, "reopened": reopened}))

asyncio.run(main(Path(sys.argv[1])))
"""


def test_a_line_past_the_file_size_limit_is_rolled_back_and_written_later(
    tmp_path: Path,
) -> None:
    """RLIMIT_FSIZE (no mount needed): a line that would pass the process's file size limit
    is written short by the kernel and cut back to its start; it waits and is written once
    the limit is raised, chain intact."""
    path = tmp_path / "audit.jsonl"
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", LIMITED, str(path)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root)},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen == {
        "refused": True,
        "size": seen["size"],
        "after": seen["size"],
        "gate": False,
        "reopened": True,
    }
    verdict = verify(read_lines(path), None)
    assert verdict.intact and verdict.records == 2


async def _submit(http: aiohttp.ClientSession, base: str, key: str) -> aiohttp.ClientResponse:
    headers = {"Authorization": f"Bearer {AGENT_TOKEN}", "Idempotency-Key": key}
    body = {"input": "report.pdf", "demo_script": [{"state": "running"}]}
    return await http.post(f"{base}/p/demo-jobs/v1/jobs", json=body, headers=headers)


async def _operations(http: aiohttp.ClientSession, base: str) -> Any:
    headers = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
    async with http.get(f"{base}/admin/operations", headers=headers) as answer:
        assert answer.status == 200
        return (await answer.json())["operations"]


async def test_served_gateway_fails_closed_on_a_full_audit_disk_and_resumes(
    tmp_path: Path,
    small_disk: SmallDisk,
    upstream: tuple[DemoProvider, str],
    gateways: list[Served],
) -> None:
    """`statusgate serve` with its audit log on a full disk answers 503 with Retry-After
    before anything is forwarded or recorded, /readyz says 503, and once space returns it
    serves again by itself with a chain `statusgate audit verify` accepts."""
    demo, url = upstream
    audit_path = small_disk.path / "audit.jsonl"
    config = {"audit": {"path": str(audit_path)}}
    served = await Served(tmp_path, url, tmp_path / "g.db", config=config).up()
    gateways.append(served)
    base = f"http://127.0.0.1:{served.port}"
    async with aiohttp.ClientSession() as http:
        first = await _submit(http, base, "a")
        assert first.status == 202, await first.text()
        job = (await first.json())["id"]
        small_disk.fill()
        sent = len(demo.log)
        refused = await _submit(http, base, "b")
        assert refused.status == 503, await refused.text()
        assert float(refused.headers["Retry-After"]) > 0
        assert "audit log" in (await refused.json())["detail"]
        status = f"{base}/p/demo-jobs/v1/jobs/{job}"
        polled = await http.get(status, headers={"Authorization": f"Bearer {AGENT_TOKEN}"})
        assert polled.status == 503
        assert len(demo.log) == sent  # nothing reached the provider
        assert len(await _operations(http, base)) == 1  # no record created
        async with http.get(f"{base}/readyz") as ready:
            assert (ready.status, (await ready.json()).get("audit")) == (503, "unwritable")
        small_disk.free()
        async with http.get(f"{base}/readyz") as ready:
            assert ready.status == 200
        again = await _submit(http, base, "b")
        assert again.status == 202, await again.text()
    stderr = served.stop()
    assert "Traceback" not in stderr
    verified = subprocess.run(
        [sys.executable, "-m", "gateway.run", "audit", "verify", str(audit_path)],
        capture_output=True,
        text=True,
        env={**os.environ},
        check=False,
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "2 records, chain intact" in verified.stdout


async def test_served_gateway_on_a_full_sqlite_disk_is_not_ready_until_space_returns(
    tmp_path: Path,
    small_disk: SmallDisk,
    upstream: tuple[DemoProvider, str],
    gateways: list[Served],
) -> None:
    """With its SQLite file on a full disk, `statusgate serve` answers /readyz 503 while
    writes fail "database or disk is full", and 200 again, submits working, once space
    returns."""
    _, url = upstream
    served = await Served(tmp_path, url, small_disk.path / "g.db").up()
    gateways.append(served)
    base = f"http://127.0.0.1:{served.port}"
    async with aiohttp.ClientSession() as http:
        assert (await _submit(http, base, "a")).status == 202
        async with http.get(f"{base}/readyz") as ready:
            assert ready.status == 200
        small_disk.fill()
        failed = await _submit(http, base, "b")
        assert failed.status == 503, await failed.text()
        async with http.get(f"{base}/readyz") as ready:
            assert ready.status == 503, await ready.text()
        small_disk.free()
        async with http.get(f"{base}/readyz") as ready:
            assert ready.status == 200, await ready.text()
        assert (await _submit(http, base, "b")).status == 202
    stderr = served.stop()
    assert "Traceback" not in stderr

"""The audit log: written by a real gateway, verified and told offline by the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.models import Event
from gateway.observe.audit import AuditLog, Fsync, canonical_json, read_lines, verify
from gateway.run.cli import main

from conftest import PROVIDER_KEY, Harness


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out + err


async def session(harness: Harness) -> str:
    """A short scripted session: a finished job, an escalated one, refusals in between."""
    job = (await (await harness.submit([{"state": "running"}, {"state": "succeeded"}])).json())[
        "id"
    ]
    for _ in range(3):
        await harness.poll(job)
    await harness.poll_when_due(job)
    await harness.poll_when_due(job)
    other = (await (await harness.submit([{"state": "odd"}], key="k2")).json())["id"]
    await harness.poll_when_due(other)
    return str(job)


async def test_gateway_writes_a_chain_that_verifies(
    harness: Harness, capsys: pytest.CaptureFixture[str]
) -> None:
    """A session's audit lines are numbered without gaps, carry the chain fields and verify as
    intact."""
    await session(harness)
    lines = harness.audit_lines()
    assert [line["seq"] for line in lines] == list(range(1, len(lines) + 1))
    events = [line["event"] for line in lines]
    assert events.count("submitted") == 2
    assert "refused" in events and "finished" in events and "escalated" in events
    assert all(set(line) >= {"seq", "at", "prev", "hash", "event", "actor"} for line in lines)
    code, out = run(["audit", "verify", str(harness.audit_path)], capsys)
    assert code == 0
    assert out.strip() == f"{harness.audit_path}: {len(lines)} records, chain intact"
    assert PROVIDER_KEY not in harness.audit_path.read_text()


async def test_refusals_are_aggregated_per_poll_window(harness: Harness) -> None:
    """Fifty too-early calls in one window make one audit line with count 50."""
    job = (await (await harness.submit([{"state": "running"}])).json())["id"]
    for _ in range(50):
        assert (await harness.poll(job)).status == 429
    assert [line["event"] for line in harness.audit_lines()] == ["submitted"]
    await harness.poll_when_due(job)
    refused = [line for line in harness.audit_lines() if line["event"] == "refused"]
    assert len(refused) == 1 and refused[0]["count"] == 50
    assert (await harness.record(job)).early_refusals == 50


async def test_lines_are_written_before_the_answer(harness: Harness) -> None:
    """An answer is given only after its audit line is in the file."""
    job = (await (await harness.submit([{"state": "running"}])).json())["id"]
    assert harness.audit_lines()[-1]["event"] == "submitted"
    await harness.poll_when_due(job)
    assert harness.audit_lines()[-1]["event"] == "polled"


async def test_story_of_a_scripted_job(
    harness: Harness, capsys: pytest.CaptureFixture[str]
) -> None:
    """queued, running, 503 with Retry-After 120, running, success: five events in order."""
    script = [
        {"state": "queued"},
        {"state": "running"},
        {"http": 503, "retry_after": "120"},
        {"state": "running"},
        {"state": "succeeded"},
    ]
    response = await harness.submit(script)
    job = (await response.json())["id"]
    operation = response.headers["Statusgate-Operation"]
    for _ in range(5):
        await harness.poll_when_due(job)
    config = harness.audit_path.parent / "gateway.yaml"
    code, out = run(["audit", "story", "--config", str(config), operation], capsys)
    assert code == 0, out
    told = out.strip().splitlines()
    assert told[0].split(" ", 1)[1].startswith("submitted, state queued, next poll")
    polls = told[1:]
    assert len(polls) == 5
    assert "polled, state queued, next poll" in polls[0] and polls[0].endswith("from local_backoff")
    assert "polled, state running" in polls[1] and polls[1].endswith("from local_backoff")
    assert "received 503, Retry-After 120, next poll" in polls[2]
    assert polls[2].endswith("from provider guidance")
    at, _, rest = polls[2].partition(" ")
    h, m, sec = (int(x) for x in at.split(":"))
    nh, nm, ns = (int(x) for x in rest.split("next poll ")[1].split(" ")[0].split(":"))
    assert (nh * 3600 + nm * 60 + ns) - (h * 3600 + m * 60 + sec) == 120
    assert "polled, state running" in polls[3]
    assert "state succeeded, finished: succeeded" in polls[4]


def sample(tmp_path: Path, count: int = 6, key: bytes | None = None) -> Path:
    import asyncio

    path = tmp_path / "audit.jsonl"

    async def write() -> None:
        log = AuditLog(path, key=key, fsync=Fsync.NEVER)
        log.open()
        for i in range(count):
            await log.append({"event": "polled", "operation_id": f"op_{i}", "actor": "gateway"})
        await log.close()

    asyncio.run(write())
    return path


def lines_of(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


CORRUPTIONS: list[tuple[str, Any, int]] = [
    ("flipped byte", lambda ls: [*ls[:2], ls[2].replace(b"op_2", b"op_X"), *ls[3:]], 3),
    ("deleted line", lambda ls: ls[:3] + ls[4:], 4),
    ("reordered lines", lambda ls: [*ls[:1], ls[2], ls[1], *ls[3:]], 2),
    ("duplicated line", lambda ls: [*ls[:4], ls[3], *ls[4:]], 5),
    ("deleted first line", lambda ls: ls[1:], 1),
]


@pytest.mark.parametrize(("what", "corrupt", "seq"), CORRUPTIONS, ids=[c[0] for c in CORRUPTIONS])
def test_verify_names_file_and_first_bad_seq(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], what: str, corrupt: Any, seq: int
) -> None:
    """Each kind of tampering makes verify exit 1 naming the file and the first bad sequence
    number."""
    path = sample(tmp_path)
    path.write_bytes(b"".join(corrupt(lines_of(path))))
    code, out = run(["audit", "verify", str(path)], capsys)
    assert code == 1
    assert out.startswith(f"{path}: chain broken at seq {seq}:"), out


def test_any_single_flipped_bit_is_caught(tmp_path: Path) -> None:
    """Flipping any one byte of any line breaks the chain at or before that line."""
    path = sample(tmp_path, count=3)
    data = path.read_bytes()
    for position in range(0, len(data) - 1, 7):
        if data[position : position + 1] == b"\n":
            continue
        mutated = data[:position] + bytes([data[position] ^ 0x01]) + data[position + 1 :]
        verdict = verify(mutated.splitlines(keepends=True), None)
        assert not verdict.intact or (verdict.torn_tail is False and verdict.records < 3)


def test_wrong_key_fails_at_the_first_line(tmp_path: Path, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """An HMAC chain verifies with its key only: a wrong key or none fails at the first line."""
    path = sample(tmp_path, key=b"right-key")
    monkeypatch.setenv("AUDIT_KEY", "right-key")
    assert run(["audit", "verify", str(path), "--key-env", "AUDIT_KEY"], capsys)[0] == 0
    monkeypatch.setenv("AUDIT_KEY", "wrong-key")
    code, out = run(["audit", "verify", str(path), "--key-env", "AUDIT_KEY"], capsys)
    assert code == 1 and "seq 1" in out
    assert run(["audit", "verify", str(path)], capsys)[0] == 1


def test_torn_final_line_is_reported_as_such(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """A torn final line is reported as an interrupted write and the chain before it stays
    intact."""
    path = sample(tmp_path)
    with path.open("ab") as handle:
        handle.write(b'{"seq": 7, "event": "pol')
    code, out = run(["audit", "verify", str(path)], capsys)
    assert code == 0
    assert "6 records, chain intact; torn final line after seq 6" in out


def test_writer_moves_a_torn_tail_aside_and_continues_the_chain(tmp_path: Path) -> None:
    """On open the writer moves a torn tail aside and continues the chain from the last whole
    line."""
    path = sample(tmp_path)
    with path.open("ab") as handle:
        handle.write(b'{"seq": 7, "ev')
    sample_more = AuditLog(path, key=None, fsync=Fsync.NEVER)
    import asyncio

    async def write() -> None:
        sample_more.open()
        await sample_more.append({"event": "polled", "operation_id": "op_after", "actor": "x"})
        await sample_more.close()

    asyncio.run(write())
    verdict = verify(lines_of(path), None)
    assert verdict.intact and verdict.records == 7 and not verdict.torn_tail
    aside = list(tmp_path.glob("audit.jsonl.torn-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == b'{"seq": 7, "ev'
    assert json.loads(lines_of(path)[-1])["operation_id"] == "op_after"


async def test_hmac_chain_from_the_gateway(make_harness: Any, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A gateway with hmac_key_env writes a chain that verifies with that key only."""
    monkeypatch.setenv("STATUSGATE_AUDIT_KEY", "k3y")
    harness = await make_harness(
        config_changes={"audit": {"path": "audit.jsonl", "hmac_key_env": "STATUSGATE_AUDIT_KEY"}}
    )
    await session(harness)
    path = str(harness.audit_path)
    assert run(["audit", "verify", path, "--key-env", "STATUSGATE_AUDIT_KEY"], capsys)[0] == 0
    assert run(["audit", "verify", path], capsys)[0] == 1


async def test_workers_append_to_one_chain(tmp_path: Path) -> None:
    """Two writers in shared mode (serve --workers) interleave appends into one chain that
    verifies: each reads the end another moved before it seals its line."""
    path = tmp_path / "audit.jsonl"
    first = AuditLog(path, key=None, shared=True)
    second = AuditLog(path, key=None, shared=True)
    first.open()
    second.open()
    for n in range(50):
        writer = first if n % 3 else second
        await writer.append({"event": "polled", "n": n})
    await first.close()
    await second.close()
    verdict = verify(read_lines(path), None)
    assert verdict.intact and verdict.records == 50


@settings(max_examples=500, deadline=None)
@given(
    st.dictionaries(
        st.text(max_size=30),
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(min_value=-(2**70), max_value=2**70),
            st.text(max_size=60),
            st.floats(allow_nan=False, allow_infinity=False),
            st.floats(min_value=-1e16, max_value=1e16),  # orjson's range too
            st.floats(min_value=1e-4, max_value=1.0),
            st.sampled_from(list(Event)),  # a str enum, as every line's event is
        ),
        max_size=20,
    )
)
def test_canonical_json_is_the_json_module_form_whichever_encoder_writes_it(
    line: dict[str, object],
) -> None:
    """The chain hashes canonical_json: the fast path (orjson, for flat lines of strings,
    integers, booleans, nulls, floats without an exponent) must be byte for byte
    json.dumps(sort_keys, compact, UTF-8), or files written by one build would not verify
    with another."""
    expected = json.dumps(line, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert canonical_json(line) == expected.encode()

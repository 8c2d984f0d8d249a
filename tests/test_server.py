"""``statusgate serve``'s start (gateway/run/server.py): the open-files limit raised to the hard
one and logged, and the agent connections it leaves room for."""

from __future__ import annotations

import asyncio
import json
import logging
import resource
from pathlib import Path

import pytest

from gateway.demo.provider import DemoProvider
from gateway.run import server
from gateway.settings.config import load_settings

from conftest import PROVIDER_ENV, Served, wait_until_up, write_config


async def test_serve_raises_the_open_files_limit_to_the_hard_one_and_logs_it(
    tmp_path: Path, upstream: tuple[DemoProvider, str], gateways: list[Served]
) -> None:
    """A gateway started with a soft open-files limit of 512 runs with its hard limit (each
    connection is a descriptor), and its start-up lines say so with both figures."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard <= 512:
        pytest.skip(f"the hard open-files limit here is {hard}: nothing to raise it to")
    served = Served(tmp_path / "a", upstream[1], tmp_path / "a.db")
    gateways.append(served)
    resource.setrlimit(resource.RLIMIT_NOFILE, (512, hard))  # inherited by the child only
    try:
        process = served.start()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    await asyncio.to_thread(wait_until_up, served.port, process)
    limits = Path(f"/proc/{process.pid}/limits").read_text()
    in_force = next(line for line in limits.splitlines() if line.startswith("Max open files"))
    assert in_force.split()[3:5] == [str(hard), str(hard)]
    lines = [json.loads(line) for line in served.stop().splitlines() if line.strip()]
    said = [line for line in lines if "open_files" in line]
    assert said and said[0]["open_files"] == hard
    assert said[0]["event"] == f"open-files limit {hard} (raised from 512)"
    serving = [line["event"] for line in lines if line["event"].startswith("serving ")]
    policies = len(list((served.folder / "policies").glob("*.yaml")))
    assert len(serving) == 1 and f": {policies} policies, store sqlite, audit " in serving[0]


def test_the_start_line_names_what_is_served_and_no_store_password(tmp_path: Path) -> None:
    """`serve`'s start line says which config, how many policies, the store's kind, the audit
    file, the webhook and where kept results go, and never the store URL's password."""
    path = write_config(
        tmp_path,
        "http://127.0.0.1:9",
        store="postgresql://statusgate:pg-secret-9a@127.0.0.1:5432/sg",
        config_changes={
            "escalation": {"webhook_url": "http://hooks.test/x"},
            "results_store": "s3://bucket-1/kept?endpoint=http://127.0.0.1:9",
        },
    )
    line = server.what_serves(load_settings(path, {**PROVIDER_ENV}))
    policies = len(list((tmp_path / "policies").glob("*.yaml")))
    assert line == (
        f"serving {path}: {policies} policies, store postgresql, audit "
        f"{tmp_path / 'audit.jsonl'}, escalation webhook on, kept results in s3://bucket-1/kept/"
    )
    assert "pg-secret-9a" not in line


def test_a_bound_past_what_the_open_files_limit_leaves_is_capped_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With 2048 descriptors, 1024 are kept for everything but agent connections: a
    ``limits.max_connections`` of 4096 is held to 1024, and a warning names the figures;
    a bound within it says nothing more than the limit."""
    assert server.connection_cap(2048) == 1024
    assert server.connection_cap(1024) == 512  # half of a small limit
    with caplog.at_level(logging.INFO, "statusgate"):
        server.log_connection_limits(2048, 1024, 4096)
        server.log_connection_limits(1 << 20, 1 << 20, 4096)
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert said == [
        ("INFO", "open-files limit 2048 (raised from 1024)"),
        (
            "WARNING",
            "limits.max_connections is 4096 but the open-files limit (2048) leaves room for"
            " 1024: the agent listener keeps at most 1024 connections",
        ),
        ("INFO", "open-files limit 1048576 (the hard limit)"),
    ]

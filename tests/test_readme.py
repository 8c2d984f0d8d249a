"""The README's walk-through, as a newcomer pastes it: every shell command of the sections
"Walk-through", "Policies" and "Operators", in order, in one bash, against a real
`statusgate demo-provider` and a real `statusgate serve` on `config/gateway.yaml` (copied to
a temporary folder so that `var/` is a temporary folder too). Only the addresses change: the
test's free ports for 8080, 8081 and 8082, its folder for /tmp. Each command must exit 0 and show
what the README says it shows. Nothing here waits on a clock: where the README waits, it
holds the call with `Prefer: wait`, and so does the test. The SDK examples of the README and
docs/ (MCP, A2A) run against the same gateway, pasted as they are.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from gateway.demo.env import demo_env

from conftest import ROOT, free_port

README = ROOT / "README.md"
WALK_SECTIONS = ("Walk-through", "Policies", "Operators")
DEMO_KEY = "demo-provider-key"  # what `make run` exports (Makefile)
CLOCK = re.compile(r"\d\d:\d\d:\d\d")


@dataclass
class Command:
    """One command of the walk as the README writes it, and the comment lines after it
    (what the README says it shows)."""

    section: str
    text: str
    shown: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Ran:
    command: Command
    stdout: str
    stderr: str
    code: int


@dataclass(frozen=True)
class Walk:
    """The walk's commands as they ran, and the folder they ran in (the README's /tmp)."""

    folder: Path
    runs: list[Ran]
    ports: dict[str, str]  # the README's address -> the test's


def sections(text: str) -> Iterator[tuple[str, str, str]]:
    """(section heading, fence language, block body) for every fenced block."""
    heading = ""
    lines = iter(text.splitlines())
    for line in lines:
        if line.startswith("#") and not line.startswith("#!"):
            heading = line.lstrip("#").strip()
            continue
        if line.startswith("```"):
            language = line[3:].strip()
            body = []
            for inner in lines:
                if inner.startswith("```"):
                    break
                body.append(inner)
            yield heading, language, "\n".join(body)


def complete(text: str) -> bool:
    """Whether bash reads ``text`` as whole commands (no open quote or continuation)."""
    if text.rstrip().endswith("\\"):
        return False
    done = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True, timeout=30)
    return done.returncode == 0


def walk_commands(text: str) -> list[Command]:
    """The walk's commands in order: lines joined until bash reads a whole command; a
    comment line between commands belongs to the command before it."""
    commands: list[Command] = []
    for heading, language, body in sections(text):
        if heading not in WALK_SECTIONS or language != "sh":
            continue
        pending: list[str] = []
        for line in body.splitlines():
            if not pending and line.lstrip().startswith("#"):
                commands[-1].shown.append(line.lstrip()[1:].strip())
                continue
            if not pending and not line.strip():
                continue
            pending.append(line)
            if complete("\n".join(pending)):
                commands.append(Command(heading, "\n".join(pending)))
                pending = []
        assert not pending, f"README section {heading}: an unfinished command: {pending}"
    return commands


def shown_after(text: str, heading: str, marker: str) -> list[str]:
    """The text block that follows the sh block containing ``marker`` in ``heading``."""
    blocks = list(sections(text))
    for i, (where, language, body) in enumerate(blocks):
        if where == heading and language == "sh" and marker in body:
            assert blocks[i + 1][1] == "text", "the block after it shows no output"
            return blocks[i + 1][2].splitlines()
    raise AssertionError(f"no sh block with {marker!r} in {heading}")


def test_walk_commands_are_read_as_bash_reads_them() -> None:
    """Continued lines, a quote spanning lines and a comment after a command are read as
    one command each, with the comment as what the command shows."""
    text = (
        '## Walk-through\n```sh\nA=1\ncurl -d \'{"a": 1,\n  "b": 2}\' \\\n  | tee x\n'
        "# shown\necho $A   # inline\n```\n## Other\n```sh\nnot this\n```\n"
    )
    commands = walk_commands(text)
    assert [c.text for c in commands] == [
        "A=1",
        'curl -d \'{"a": 1,\n  "b": 2}\' \\\n  | tee x',
        "echo $A   # inline",
    ]
    assert commands[1].shown == ["shown"]


# --- the walk, run once for the module --------------------------------------------------------


def wait_for(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    """Until something listens on ``port``; a process that exits fails with its log."""
    deadline = time.monotonic() + 120  # generous: a loaded machine imports slowly
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"exited with {process.returncode}:\n{log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"nothing listens on {port}:\n{log.read_text()}")


def lay_out(folder: Path, gateway_port: int, provider_port: int, agent_port: int) -> None:
    """config/, policies/, var/ and .venv/bin/statusgate as the repository has them, the
    ports moved to the test's."""
    (folder / "var").mkdir()
    (folder / "config").mkdir()
    config = yaml.safe_load((ROOT / "config" / "gateway.yaml").read_text())
    assert config["listen"]["port"] == 8080 and config["store"].startswith("sqlite:///../var/")
    config["listen"]["port"] = gateway_port
    config["public_base_url"] = f"http://127.0.0.1:{gateway_port}"
    # make run's config sends every provider to the demo provider (on 8081), the A2A one to
    # the demo A2A agent (on 8082)
    assert config["upstreams"] == {
        "*": "http://127.0.0.1:8081/{provider}",
        "demo-agent": "http://127.0.0.1:8082",
    }
    config["upstreams"] = {
        "*": f"http://127.0.0.1:{provider_port}/{{provider}}",
        "demo-agent": f"http://127.0.0.1:{agent_port}",
    }
    (folder / "config" / "gateway.yaml").write_text(yaml.safe_dump(config))
    shutil.copytree(ROOT / "policies", folder / "policies")
    shim = folder / ".venv" / "bin" / "statusgate"
    shim.parent.mkdir(parents=True)
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m gateway.run "$@"\n')
    shim.chmod(0o755)
    python = folder / ".venv" / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)


def script(commands: list[Command], folder: Path, ports: dict[str, str]) -> str:
    """One bash script running every command in turn, each one's output and exit status
    kept in out/N.*; the addresses moved to the test's."""
    lines = [f'cd "{folder}"']
    for i, command in enumerate(commands):
        text = command.text.replace("/tmp/", f"{folder}/")
        for old, new in ports.items():
            text = text.replace(old, new)
        lines += ["{ " + text, f"}} >out/{i}.out 2>out/{i}.err; echo $? >out/{i}.rc"]
    return "\n".join(lines) + "\n"


def start(folder: Path, args: list[str], port: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``statusgate ARGS`` in ``folder``, its output in var/<command>.log, once it listens."""
    log = folder / "var" / f"{args[0]}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "gateway.run", *args],
            cwd=folder,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(port, process, log)
    except BaseException:
        process.kill()
        process.wait()
        raise
    return process


def results(folder: Path, commands: list[Command]) -> list[Ran]:
    out = folder / "out"
    return [
        Ran(
            command,
            (out / f"{i}.out").read_text(),
            (out / f"{i}.err").read_text(),
            int((out / f"{i}.rc").read_text()),
        )
        for i, command in enumerate(commands)
    ]


@pytest.fixture(scope="module")
def walk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Walk]:
    """The demo provider and the gateway as `make run` starts them (DEMO_API_KEY set), and
    the walk run once against them in a shell of its own (no DEMO_API_KEY: "another shell")."""
    if shutil.which("curl") is None:
        pytest.skip("curl is not on PATH: the README's walk-through uses it")
    folder = tmp_path_factory.mktemp("readme")
    gateway_port, provider_port, agent_port = free_port(), free_port(), free_port()
    lay_out(folder, gateway_port, provider_port, agent_port)
    commands = walk_commands(README.read_text())
    ports = {
        "127.0.0.1:8080": f"127.0.0.1:{gateway_port}",
        "127.0.0.1:8081": f"127.0.0.1:{provider_port}",
        "127.0.0.1:8082": f"127.0.0.1:{agent_port}",
    }
    (folder / "walk.sh").write_text(script(commands, folder, ports))
    (folder / "out").mkdir()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(folder),
        "LANG": "C.UTF-8",
        "PYTHONPATH": str(ROOT),
    }
    # as make run: every credential the shipped policies read set to the demo key
    server_env = {**env, **demo_env(ROOT / "policies", DEMO_KEY), "DEMO_API_KEY": DEMO_KEY}
    processes = [
        start(
            folder,
            ["demo-provider", "--port", str(provider_port), "--a2a-port", str(agent_port)],
            provider_port,
            server_env,
        )
    ]
    try:
        processes.append(
            start(folder, ["serve", "--config", "config/gateway.yaml"], gateway_port, server_env)
        )
        subprocess.run(["bash", str(folder / "walk.sh")], env=env, timeout=600, check=True)
        yield Walk(folder, results(folder, commands), ports)
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def ran(walk: Walk, fragment: str) -> Ran:
    """The one command whose text holds ``fragment``."""
    found = [r for r in walk.runs if fragment in r.command.text]
    assert len(found) == 1, f"{len(found)} README commands hold {fragment!r}"
    return found[0]


def status(output: str) -> int:
    """The status code of `curl -i` output."""
    match = re.match(r"HTTP/1\.1 (\d{3}) ", output)
    assert match, output[:200]
    return int(match.group(1))


def headers(output: str) -> dict[str, str]:
    """The header lines of `curl -i` output, names in lower case."""
    head = output.split("\r\n\r\n", 1)[0].split("\n\n", 1)[0]
    pairs = [line.split(":", 1) for line in head.splitlines()[1:] if ":" in line]
    return {name.strip().lower(): value.strip() for name, value in pairs}


def body(output: str) -> str:
    return output.replace("\r\n", "\n").split("\n\n", 1)[1]


# --- what the README promises -----------------------------------------------------------------


def test_every_walk_command_exits_0(walk: Walk) -> None:
    """Every command of the walk-through, the policy tools and the operator examples exits
    0 when pasted in order."""
    assert {r.command.section for r in walk.runs} == set(WALK_SECTIONS)
    failed = [f"{r.command.text}\n-> {r.code}: {r.stderr[-500:]}" for r in walk.runs if r.code]
    assert not failed, "\n\n".join(failed)


def test_submit_answers_as_the_readme_shows(walk: Walk) -> None:
    """The submit is 202 pending with every header the README's shown answer has, and the
    first permitted poll where the provider's hint put it."""
    submit = ran(walk, "tee /tmp/submit.txt")
    shown = shown_after(README.read_text(), "Walk-through", "tee /tmp/submit.txt")
    assert submit.stdout.splitlines()[0].strip() == shown[0] == "HTTP/1.1 202 Accepted"
    names = {line.split(":", 1)[0].lower() for line in shown[1:] if ": " in line}
    got = headers(submit.stdout)
    assert names - {"content-type"} <= set(got), names - set(got)
    assert got["statusgate-outcome"] == "pending" and got["retry-after"] == "5"
    assert json.loads(body(submit.stdout))["state"] == "queued"


def test_polls_are_refused_then_held_then_answered_from_the_record(walk: Walk) -> None:
    """The poll at once is 429 too-early with a Retry-After; the held poll answers 200
    succeeded once the job is done; the next one is answered from the record."""
    early = ran(walk, "# 429 too-early")
    assert status(early.stdout) == 429
    assert 1 <= int(headers(early.stdout)["retry-after"]) <= 5
    assert json.loads(body(early.stdout))["type"] == "/problems/too-early"
    held = ran(walk, "# held, then 200 succeeded")
    assert status(held.stdout) == 200
    assert headers(held.stdout)["statusgate-outcome"] == "succeeded"
    assert headers(held.stdout)["preference-applied"] == "wait=30"
    again = ran(walk, "# 200 succeeded, from the record")
    assert status(again.stdout) == 200
    assert headers(again.stdout)["statusgate-outcome"] == "succeeded"


def test_provider_saw_one_submit_and_two_polls(walk: Walk) -> None:
    """The demo provider's log of the job: POST /v1/jobs, then GET /v1/jobs/<job> exactly
    twice, as the README says."""
    job = json.loads(body(ran(walk, "tee /tmp/submit.txt").stdout))["id"]
    log = ran(walk, "/_demo/log?job=$JOB")
    assert log.command.shown == ["POST /v1/jobs, then GET /v1/jobs/<job> exactly twice"]
    status_path = f'"path": "/v1/jobs/{job}"'
    assert log.stdout.splitlines() == ['"path": "/v1/jobs"', status_path, status_path]


def test_audit_story_is_the_one_the_readme_shows(walk: Walk) -> None:
    """`audit story` tells the job's events as the README shows them, clock times aside;
    the operation's record is served to the operator."""
    story = ran(walk, "audit story --config config/gateway.yaml $OP")
    assert [CLOCK.sub("T", line) for line in story.stdout.splitlines()] == [
        CLOCK.sub("T", line) for line in story.command.shown
    ]
    op = headers(ran(walk, "tee /tmp/submit.txt").stdout)["statusgate-operation"]
    record = ran(walk, "$GW/admin/operations/$OP | python3 -m json.tool")
    assert f'"operation_id": "{op}"' in record.stdout


def test_stuck_job_escalates_with_the_actions_that_can_succeed(walk: Walk) -> None:
    """The held poll of the stuck job is 409 operation-escalated, deadline_exceeded, with the
    detail and permitted actions the README shows."""
    escalated = json.loads(ran(walk, "$STUCK -H \"$AUTH\" -H 'Prefer: wait=30'").stdout)
    shown = json.loads(
        "\n".join(ran(walk, "$STUCK -H").command.shown).replace(',"message":...', "")
    )
    assert escalated["status"] == 409 == shown["status"]
    for member in ("type", "reason", "detail", "permitted_actions"):
        assert escalated[member] == shown[member], member
    assert escalated["permitted_actions"] == ["extend", "cancel_at_provider", "abandon"]


def test_operator_extends_then_abandons_the_stuck_job(walk: Walk) -> None:
    """The queue lists the stuck job's escalation; extend answers it pending again, abandon
    ends it abandoned, both on the operation the walk captured."""
    assert ran(walk, "-D /tmp/stuck.headers").code == 0
    stuck_op = headers((walk.folder / "stuck.headers").read_text())["statusgate-operation"]
    queue = json.loads(ran(walk, '"$GW/admin/escalations"').stdout)["escalations"]
    assert [e["reason"] for e in queue if e["operation_id"] == stuck_op] == ["deadline_exceeded"]
    extended = json.loads(ran(walk, "/extend").stdout)
    assert extended["action"] == "extend" and extended["record"]["outcome"] == "pending"
    assert extended["record"]["operation_id"] == stuck_op
    abandoned = json.loads(ran(walk, "/abandon").stdout)
    assert abandoned["action"] == "abandon" and abandoned["record"]["outcome"] == "abandoned"


def test_policy_tools_answer_as_shown(walk: Walk) -> None:
    """`check` passes on the shipped config, `policy test` prints the verdict and exit 3
    the README shows, and `schema policy` writes a JSON Schema."""
    check = ran(walk, "statusgate check --config config/gateway.yaml")
    shipped = len(list((ROOT / "policies").glob("*.yaml")))
    assert f": ok: {shipped} policies" in check.stdout
    verdict = ran(walk, "statusgate policy test")
    assert verdict.stdout.splitlines() == verdict.command.shown
    assert ran(walk, "statusgate schema policy > policy.schema.json").code == 0
    schema = json.loads((walk.folder / "policy.schema.json").read_text())
    assert "provider" in schema["properties"]


def test_the_a2a_walk_through_runs_against_make_runs_gateway(walk: Walk) -> None:
    """docs/a2a.md's a2a-sdk walk-through, pasted as it is (the agent token and the addresses
    moved to the test's), against the gateway and demo provider as `make run` starts them:
    the card is fetched through the gateway, the naive loop ends with the artifact."""
    pytest.importorskip("a2a.client", reason="a2a-sdk is not installed (statusgate[a2a])")
    text = (ROOT / "docs" / "a2a.md").read_text()
    blocks = [body for heading, language, body in sections(text) if language == "python"]
    code = next(body for body in blocks if "create_client" in body)
    assert "<agent token>" in code
    code = code.replace("<agent token>", "demo-agent-token")
    for old, new in walk.ports.items():
        code = code.replace(old, new)
    agent_port = int(walk.ports["127.0.0.1:8082"].rsplit(":", 1)[1])
    deadline = time.monotonic() + 30
    while True:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", agent_port)) == 0:
                break
        assert time.monotonic() < deadline, "the demo A2A agent never listened"
        time.sleep(0.1)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "done: hello"


def run_python_block(walk: Walk, code: str) -> str:
    """A doc's python block, pasted as it is (the addresses moved to the test's), against the
    walk's gateway: its standard output; it must exit 0."""
    for old, new in walk.ports.items():
        code = code.replace(old, new)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout


@pytest.mark.parametrize("doc", ["README.md", "docs/mcp.md"])
def test_the_mcp_sdk_examples_run_against_make_runs_gateway(walk: Walk, doc: str) -> None:
    """The README's and docs/mcp.md's official-SDK examples, pasted as they are, against the
    gateway as `make run` starts it: the job is started over MCP (2026-07-28), waited for and
    its result fetched; each prints what the demo job produced."""
    pytest.importorskip("mcp", reason="the MCP SDK is not installed (mcp>=2.3)")
    text = (ROOT / doc).read_text()
    blocks = [body for _, language, body in sections(text) if language == "python"]
    [code] = [body for body in blocks if "streamable_http_client" in body]
    lines = run_python_block(walk, code).splitlines()
    printed = ast.literal_eval(lines[-1])  # a dict, as print() shows it
    if doc == "docs/mcp.md":
        assert lines[0] == "2026-07-28", lines  # print(mcp.protocol_version)
        assert printed["data"] == {"pages": 3}, lines  # result["json"]
    else:  # get_result's result: the provider's answer from the result route
        assert printed["status"] == 200 and printed["json"]["data"] == {"pages": 3}, lines

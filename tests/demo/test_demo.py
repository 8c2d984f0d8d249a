"""`statusgate demo` runs by itself on loopback and shows refusals and escalations."""

from __future__ import annotations

import gzip
import socket
import subprocess
import sys
import urllib.request

import pytest

from gateway.demo import showcase
from gateway.demo.env import demo_env
from gateway.demo.faults import bomb as make_bomb
from gateway.demo.pack import doubles
from gateway.demo.showcase import LEGACY
from gateway.demo.walkthrough import fleet, show
from gateway.settings.policy import load_policy

from conftest import ROOT, free_port, wait_until_up


async def test_demo_show_refuses_loops_and_escalates() -> None:
    """The demo show refuses most looping calls, escalates budget and unknown-state jobs and
    never prints the provider key."""
    lines = await show()
    text = "\n".join(lines)
    summary = next(line for line in lines if line.startswith("Agents made"))
    calls, reached = (int(word) for word in summary.split() if word.isdigit())
    assert reached * 5 < calls
    assert "Stopped because: request_budget_exhausted" in text
    assert "Stopped because: unknown_state" in text
    assert "demo-show-key" not in text


async def test_fleet_scene_shows_the_gateway_shielding_the_provider() -> None:
    """Through the gateway a fleet makes a third of the provider calls it makes directly, under
    the provider's rate ceiling."""
    lines = await fleet(agents=8, rate="5/s", finish_after=1.0)
    direct = next(line for line in lines if line.startswith("straight to provider")).split()
    gated = next(line for line in lines if line.startswith("through Statusgate")).split()
    direct_calls, gated_calls = int(direct[4]), int(gated[3])
    assert gated_calls * 3 < direct_calls
    assert int(gated[-2]) <= 5  # peak calls in any second, under the 5/s ceiling
    assert int(direct[-1]) == int(gated[-1]) == 8  # every agent saw its job finish


def test_the_gzip_bomb_is_a_whole_gzip_stream_of_its_json() -> None:
    """The demo's gzip bomb (one deflated MiB repeated, its own gzip frame) inflates, CRC and
    length checked, to the JSON it promises: its megabytes of spaces in a string."""
    bomb = make_bomb(3.0)
    assert len(bomb) < 10_000
    assert gzip.decompress(bomb) == b'{"state": "running", "pad": "' + b" " * 3 * 2**20 + b'"}'


@pytest.mark.parametrize("name", sorted([*LEGACY, *doubles()]))
async def test_demo_of_one_shipped_policy_reaches_its_outcome(name: str) -> None:
    """`statusgate demo --provider NAME` drives the shipped policy against the demo
    provider's API for it: naive agents see the job succeed with the provider polled
    within the policy's budget, and the story and no key are printed."""
    lines = await showcase.show(name, ROOT / "policies")
    text = "\n".join(lines)
    assert "Outcome: succeeded" in text, text
    reached = next(line for line in lines if line.startswith("Calls that reached"))
    polls = int(reached.split("status: ")[1].split(",")[0].rstrip(")"))
    budget = showcase.shipped_policy(name, ROOT / "policies").polling.max_status_requests
    assert 1 <= polls <= budget, text
    assert "finished: succeeded" in text
    assert showcase.KEY not in text
    if showcase.shipped_policy(name, ROOT / "policies").usage:  # SPEC 23: the double reports them
        usage = next((line for line in lines if line.startswith("Usage: ")), None)
        assert usage is not None and any(c.isdigit() for c in usage), text


def test_demo_of_an_unknown_policy_names_the_shipped_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An unknown provider name is one line listing the shipped policies, exit 1."""
    assert showcase.run("no-such-provider", ROOT / "policies") == 1
    out = capsys.readouterr().out
    assert "no policy 'no-such-provider'" in out and "openai-batch" in out


def test_every_credential_the_shipped_policies_read_is_set_for_the_demo() -> None:
    """The demo's environment names every ${VAR} a shipped policy requires, so `make run`
    loads every shipped policy without a real key, and a policy with a default needs none."""
    env = demo_env(ROOT / "policies", "k")
    for path in (ROOT / "policies").glob("*.yaml"):
        load_policy(path, path.name, env)
    assert env["DEMO_API_KEY"] == "k"


def test_every_shipped_policy_has_a_demo() -> None:
    """Each policy in policies/ is spoken by the demo provider (a double or a legacy family)
    or is an A2A policy the demo A2A agent serves: `demo --provider` runs for every one."""
    shipped = {path.stem for path in (ROOT / "policies").glob("*.yaml")}
    a2a = {
        name
        for name in shipped
        if showcase.shipped_policy(name, ROOT / "policies").protocol == "a2a"
    }
    assert a2a == {"demo-agent"}
    assert shipped - a2a == set(LEGACY) | set(doubles())


async def test_demo_of_the_shipped_a2a_policy_completes_the_task() -> None:
    """`statusgate demo --provider demo-agent` sends a message to the demo A2A agent through
    the gateway: naive GetTask callers see the task complete, most of their calls answered
    from the record, the agent polled within the policy's budget, and no key printed."""
    lines = await showcase.show("demo-agent", ROOT / "policies")
    text = "\n".join(lines)
    assert "TASK_STATE_COMPLETED" in text and "finished: succeeded" in text, text
    reached = next(line for line in lines if line.startswith("Calls that reached"))
    polls = sum(
        int(part.rsplit(": ", 1)[1])
        for part in reached.split("(")[1].rstrip(")").split(", ")
        if part.startswith("GET /tasks/")
    )
    calls = next(line for line in lines if line.startswith("Callers' GetTask calls"))
    budget = showcase.shipped_policy("demo-agent", ROOT / "policies").polling
    assert 1 <= polls <= budget.max_status_requests, text
    assert polls * 3 < int(calls.split(": ")[1].split(",")[0]), text
    assert showcase.KEY not in text


def demo_provider_output(command: list[str], port: int) -> str:
    """Start ``command`` (a demo provider on ``port``), submit one demo job to it (it
    serves), stop it with SIGTERM, and return what it printed."""
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_until_up(port, process)
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/jobs",
            data=b'{"input": "x"}',
            headers={"Authorization": "Bearer demo-provider-key"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310 (loopback)
            assert answer.status in (200, 201, 202)
        assert process.poll() is None
    finally:
        process.terminate()
        out = process.communicate(timeout=30)[0].decode()
    return out


def test_the_demo_provider_serves_when_the_a2a_agents_port_is_taken() -> None:
    """`statusgate demo-provider --port N` keeps serving the provider's APIs when N + 1 (the
    demo A2A agent's port) is taken, says so, and ends on SIGTERM."""
    with socket.socket() as blocker:
        port = free_port()
        try:
            blocker.bind(("127.0.0.1", port + 1))
        except OSError:
            pytest.skip(f"127.0.0.1:{port + 1} is in use already; nothing to take")
        blocker.listen()
        command = [sys.executable, "-m", "gateway.run", "demo-provider", "--port", str(port)]
        out = demo_provider_output(command, port)
    assert "is taken; the demo provider goes on without it" in out, out


def test_the_demo_provider_says_when_it_cannot_start_the_a2a_agent() -> None:
    """Without the a2a extra (a wheel installed alone, without `statusgate[a2a]`), the
    demo provider serves its APIs and says the demo A2A agent is not started and why, so
    docs/a2a.md's walk-through does not meet a 503 with no word on the console."""
    port = free_port()
    # the extra missing: importing uvicorn fails as it does in a venv without it
    code = (
        "import sys; sys.modules['uvicorn'] = None; from gateway.run.cli import main; "
        "sys.exit(main(sys.argv[1:]))"
    )
    command = [sys.executable, "-c", code, "demo-provider", "--port", str(port)]
    out = demo_provider_output(command, port)
    assert "demo A2A agent not started: a2a-sdk and uvicorn are not installed" in out, out
    assert "pip install 'statusgate[a2a]'" in out, out
    assert "demo A2A agent listening" not in out, out

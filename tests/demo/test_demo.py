"""`statusgate demo` runs by itself on loopback and shows refusals and escalations."""

from __future__ import annotations

import gzip

from gateway.demo.provider import _bomb
from gateway.demo.walkthrough import fleet, show


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
    bomb = _bomb(3.0)
    assert len(bomb) < 10_000
    assert gzip.decompress(bomb) == b'{"state": "running", "pad": "' + b" " * 3 * 2**20 + b'"}'

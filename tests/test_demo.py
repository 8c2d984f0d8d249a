"""`statusgate demo` runs by itself on loopback and shows refusals and escalations."""

from __future__ import annotations

from gateway.demo import show


async def test_demo_show_refuses_loops_and_escalates() -> None:
    lines = await show()
    text = "\n".join(lines)
    summary = next(line for line in lines if line.startswith("Agents made"))
    calls, reached = (int(word) for word in summary.split() if word.isdigit())
    assert reached * 5 < calls
    assert "Stopped because: request_budget_exhausted" in text
    assert "Stopped because: unknown_state" in text
    assert "demo-show-key" not in text

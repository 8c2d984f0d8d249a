"""`statusgate init DIR`: a starter config and the shipped policies written into a folder,
which `check` accepts; files that exist are refused unless --force (run from the checkout:
tests/test_dist.py runs the same from the wheel)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from gateway.run.cli import main

from conftest import PROVIDER_ENV, ROOT

SHIPPED = sorted(path.name for path in (ROOT / "policies").glob("*.yaml"))


def init(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["init", *args])
    out, err = capsys.readouterr()
    return code, out, err


def token(out: str, who: str) -> str:
    found = re.search(rf"^{who} token \(shown once[^)]*\): (\S+)$", out, re.MULTILINE)
    assert found, out
    return found.group(1)


@pytest.fixture(autouse=True)
def demo_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in PROVIDER_ENV.items():
        monkeypatch.setenv(name, value)


def test_init_writes_every_shipped_policy_and_a_config_check_accepts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """init writes gateway.yaml and a copy of every policies/*.yaml, names each file and the
    next commands, and `check` accepts the folder with a SQLite store in it."""
    folder = tmp_path / "starter"
    code, out, err = init(capsys, str(folder))
    assert code == 0, err
    assert sorted(p.name for p in (folder / "policies").iterdir()) == SHIPPED
    for name in SHIPPED:
        assert (folder / "policies" / name).read_bytes() == (ROOT / "policies" / name).read_bytes()
        assert f"wrote {folder / 'policies' / name}\n" in out
    assert f"wrote {folder / 'gateway.yaml'}\n" in out
    assert f"statusgate check --config {folder / 'gateway.yaml'}" in out
    assert f"statusgate serve --config {folder / 'gateway.yaml'}" in out
    assert "statusgate demo-provider" in out
    config = (folder / "gateway.yaml").read_text()
    for who in ("Agent", "Operator"):
        secret = token(out, who)
        assert secret not in config
        assert hashlib.sha256(secret.encode()).hexdigest() in config

    assert main(["check", "--config", str(folder / "gateway.yaml")]) == 0
    summary = capsys.readouterr().out
    assert f"ok: {len(SHIPPED)} policies" in summary and "store sqlite" in summary


def test_init_refuses_files_that_exist_unless_forced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A second init names every file that exists and writes nothing; --force rewrites them
    with new tokens."""
    folder = tmp_path / "starter"
    assert init(capsys, str(folder), "--policy", "demo-jobs")[0] == 0
    (folder / "gateway.yaml").write_text("# mine\n")
    code, out, err = init(capsys, str(folder), "--policy", "demo-jobs", "--policy", "replicate")
    assert code == 1 and out == ""
    assert err.splitlines() == [
        f"{folder / 'gateway.yaml'}: exists (--force replaces it)",
        f"{folder / 'policies' / 'demo-jobs.yaml'}: exists (--force replaces it)",
    ]
    assert (folder / "gateway.yaml").read_text() == "# mine\n"
    assert not (folder / "policies" / "replicate.yaml").exists()

    code, out, err = init(capsys, str(folder), "--policy", "demo-jobs", "--force")
    assert code == 0, err
    assert "starter-team" in (folder / "gateway.yaml").read_text()


def test_init_writes_only_the_chosen_policies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--policy chooses the shipped policies written; the demo's curl line comes with
    demo-jobs, and check counts just those."""
    folder = tmp_path / "two"
    code, out, _ = init(capsys, str(folder), "--policy", "replicate", "--policy", "demo-jobs")
    assert code == 0
    assert sorted(p.name for p in (folder / "policies").iterdir()) == [
        "demo-jobs.yaml",
        "replicate.yaml",
    ]
    assert f"Bearer {token(out, 'Agent')}" in out and "/p/demo-jobs/v1/jobs" in out
    assert main(["check", "--config", str(folder / "gateway.yaml")]) == 0
    assert "ok: 2 policies (demo-jobs, replicate)" in capsys.readouterr().out


def test_init_refuses_an_unknown_policy_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unknown --policy name is one line listing the shipped ones; no file is written."""
    folder = tmp_path / "none"
    code, out, err = init(capsys, str(folder), "--policy", "demo-jobs", "--policy", "acme")
    assert code == 1 and out == ""
    assert err.startswith("--policy acme: no shipped policy of that name (anthropic-batches, ")
    assert "demo-jobs" in err and err.count("\n") == 1
    assert not folder.exists()


def test_demo_of_one_provider_reads_the_shipped_policies_from_anywhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`statusgate demo --provider NAME` without --policies, run from a folder with no
    policies/, shows that shipped policy's job to its end."""
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--provider", "demo-jobs"]) == 0
    assert "finished: succeeded" in capsys.readouterr().out


def test_a_starter_without_the_demo_agent_has_no_upstream_for_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The starter config sends demo-agent to the demo A2A agent (8082) only when its policy
    is written: `init --policy demo-jobs` gives a folder `check` accepts, not an upstream
    entry naming a policy that is not there."""
    folder = tmp_path / "starter"
    assert init(capsys, str(folder), "--policy", "demo-jobs")[0] == 0
    assert "demo-agent" not in (folder / "gateway.yaml").read_text()
    assert main(["check", "--config", str(folder / "gateway.yaml")]) == 0, capsys.readouterr()
    whole = tmp_path / "whole"
    assert init(capsys, str(whole))[0] == 0
    assert "demo-agent: http://127.0.0.1:8082" in (whole / "gateway.yaml").read_text()

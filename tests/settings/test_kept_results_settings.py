"""Kept results in the settings (SPEC 23): a policy's ``results:`` section and the gateway's
``results_store:``, each mistake reported by ``check`` as one clear line naming the file
and the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway import ConfigError
from gateway.settings.config import load_settings
from gateway.settings.keeping import FileTarget, S3Target

from conftest import PROVIDER_ENV, write_config

UPSTREAM = "http://127.0.0.1:9"


def problems(folder: Path, **kw: Any) -> list[str]:
    try:
        load_settings(write_config(folder, UPSTREAM, **kw), env=PROVIDER_ENV)
    except ConfigError as exc:
        return exc.problems
    return []


def keeping(results: dict[str, Any]) -> dict[str, Any]:
    return {"policy_changes": {"demo-jobs": {"results": results}}}


@pytest.mark.parametrize(
    ("results", "line"),
    [
        ({"keep": True, "ttl": "0s"}, "demo-jobs.yaml: results.ttl: must be greater than 0"),
        ({"keep": True, "max_bytes": "0B"}, "results.max_bytes: must be greater than 0"),
        ({"keep": True, "max_bytes": "lots"}, 'results.max_bytes: must be a size like "8MiB"'),
        ({"keep": "yes"}, "results.keep:"),
        ({"keep": True, "size": "1MiB"}, "results.size:"),
    ],
)
def test_a_results_section_is_checked(tmp_path: Path, results: dict[str, Any], line: str) -> None:
    """Each invalid value is one line naming the policy file and the field."""
    found = problems(tmp_path, **keeping(results))
    assert any(line in problem for problem in found), found


def test_keeping_results_needs_a_result_route(tmp_path: Path) -> None:
    changes = {"results": {"keep": True}, "routes": {"result": None}}
    found = problems(tmp_path, policy_changes={"demo-jobs": changes})
    assert any("results.keep: needs a result route" in line for line in found), found


def test_a_shared_store_needs_a_results_store_while_a_policy_keeps_results(
    tmp_path: Path,
) -> None:
    """Redis or PostgreSQL with no results_store: refused, naming the policies that keep
    results and what to write; fine with a results_store, or when no policy keeps them."""
    redis = {"store": "redis://127.0.0.1:6379/0"}
    found = problems(tmp_path / "a", **redis, **keeping({"keep": True}))
    assert len(found) == 1 and "results_store: must be set" in found[0], found
    assert "(demo-jobs)" in found[0] and "s3://" in found[0]
    shared = {"results_store": "s3://bucket/kept?endpoint=http://127.0.0.1:9000"}
    assert problems(tmp_path / "b", **redis, config_changes=shared, **keeping({"keep": True})) == []
    assert problems(tmp_path / "c", **redis) == []


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://host/kept", "must be file://<folder> or s3://"),
        ("s3:///kept", "s3:// must name a bucket"),
        ("s3://bucket/kept?endpoint=ftp://x", "endpoint"),
        ("s3://bucket/kept?color=red", "unknown option(s) color"),
        ("file://", "file:// must name a folder"),
    ],
)
def test_a_results_store_url_is_checked(tmp_path: Path, url: str, message: str) -> None:
    found = problems(tmp_path, config_changes={"results_store": url})
    assert any("results_store" in line and message in line for line in found), found


def test_results_store_targets(tmp_path: Path) -> None:
    """The default folder is beside the SQLite file; a relative file:// folder is read
    against the config folder; s3:// keeps its bucket, prefix, endpoint and region."""
    path = write_config(tmp_path / "a", UPSTREAM, store="sqlite:///var/g.db")
    target = load_settings(path, env=PROVIDER_ENV).results_target
    assert target == FileTarget((tmp_path / "a" / "var" / "g.db.results").resolve())
    changes = {"results_store": "file://kept"}
    path = write_config(tmp_path / "b", UPSTREAM, config_changes=changes)
    assert load_settings(path, env=PROVIDER_ENV).results_target == FileTarget(
        (tmp_path / "b" / "kept").resolve()
    )
    url = "s3://bucket/a/b?endpoint=http://127.0.0.1:9000/&region=eu-west-1"
    path = write_config(tmp_path / "c", UPSTREAM, config_changes={"results_store": url})
    assert load_settings(path, env=PROVIDER_ENV).results_target == S3Target(
        "bucket", "a/b/", "http://127.0.0.1:9000", "eu-west-1"
    )

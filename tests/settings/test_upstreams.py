"""`upstreams` in the gateway config sends providers' calls to another origin."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gateway import ConfigError
from gateway.settings.config import load_settings

from conftest import PROVIDER_ENV, write_config


def test_named_provider_and_star_with_the_provider_placeholder(tmp_path: Path) -> None:
    """A provider's own entry wins over "*", and {provider} becomes the provider's name."""
    path = write_config(
        tmp_path,
        "https://api.example.com",
        config_changes={
            "upstreams": {
                "*": "http://127.0.0.1:9/{provider}/",
                "openai-batch": "https://staging.example.com/v1-proxy",
            }
        },
    )
    policies = load_settings(path, env=PROVIDER_ENV).policies
    assert policies["openai-batch"].upstream == "https://staging.example.com/v1-proxy"
    assert policies["demo-jobs"].upstream == "http://127.0.0.1:9/demo-jobs"


def test_an_unknown_provider_or_a_bad_url_is_named(tmp_path: Path) -> None:
    """Entries for no policy and URLs that are not http(s) fail the load with file:field."""
    path = write_config(tmp_path, "https://api.example.com")
    config = yaml.safe_load(path.read_text())
    config["upstreams"] = {"no-such": "http://127.0.0.1:9"}
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError) as caught:
        load_settings(path, env=PROVIDER_ENV)
    assert any("upstreams.no-such: no policy for 'no-such'" in p for p in caught.value.problems)
    config["upstreams"] = {"*": "ftp://somewhere"}
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError) as caught:
        load_settings(path, env=PROVIDER_ENV)
    assert any(": upstreams:" in p and "http" in p for p in caught.value.problems), caught.value


def test_shipped_policies_name_their_providers_public_origin() -> None:
    """Every shipped policy but the demo's own two names its provider's public origin (or a
    ``${VAR:-...}`` for a per-customer host), never the demo provider: the demo reaches
    them through config/gateway.yaml's ``upstreams`` redirect."""
    from urllib.parse import urlsplit

    from conftest import ROOT

    for path in sorted((ROOT / "policies").glob("*.yaml")):
        upstream = yaml.safe_load(path.read_text())["upstream"]
        if path.stem in ("demo-jobs", "demo-agent"):  # the demo provider's and demo agent's
            continue
        url = upstream.split(":-", 1)[1].rstrip("}") if upstream.startswith("${") else upstream
        host = urlsplit(url).hostname or ""
        assert host not in ("127.0.0.1", "localhost"), (path.name, upstream)
        assert url.startswith("https://") or path.stem == "celery-flower", (path.name, upstream)

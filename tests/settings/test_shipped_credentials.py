"""Each shipped policy reads its provider's key from the variable that provider's own SDK or
CLI reads (docs/providers.md, "Setting its credential"): a platform team copying one sets the
key it already has, never the demo's ``DEMO_API_KEY``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from gateway import ConfigError
from gateway.settings.policy import load_policy
from gateway.settings.shapes import with_shape

from conftest import ROOT

# ${NAME} without a default: a variable the policy cannot load without
REQUIRED = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
DEMO = ("demo-jobs", "demo-agent")  # they front the demo provider itself
# The policies written before the provider pack, and the variables their providers' own
# clients read: the anthropic and openai SDKs, google-genai (as gemini-batch), boto3 (as the
# aws-job shape), the azure-ai-documentintelligence samples (with its endpoint's), and the
# two hosts of your own (Flower's basic auth, a batch API beside ${BATCH_API_UPSTREAM}).
LEGACY = {
    "anthropic-batches": ["ANTHROPIC_API_KEY"],
    "openai-batch": ["OPENAI_API_KEY"],
    "google-operations": ["GEMINI_API_KEY"],
    "aws-transcribe": ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"],
    "azure-read": ["DOCUMENTINTELLIGENCE_API_KEY"],
    "celery-flower": ["FLOWER_BASIC_AUTH_BASE64"],
    "batch-api": ["BATCH_API_KEY"],
}


def credential_variables(path: Path) -> list[str]:
    """The variables the policy's credential reads, those its shape fills included."""
    raw = with_shape(yaml.safe_load(path.read_text()))
    return REQUIRED.findall(json.dumps(raw["credential"]))


def documented() -> dict[str, set[str]]:
    """docs/providers.md's variable table: each variable and the policies said to read it."""
    text = (ROOT / "docs/providers.md").read_text()
    rows = re.findall(r"^\| `([A-Z][A-Z0-9_]*)` \| ((?:`[a-z0-9-]+`(?:, )?)+) \|$", text, re.M)
    return {name: set(re.findall(r"`([a-z0-9-]+)`", policies)) for name, policies in rows}


def test_only_the_demos_own_policies_read_the_demo_key() -> None:
    """No shipped policy but demo-jobs and demo-agent reads ${DEMO_API_KEY}; each reads a
    variable of its own provider, the legacy ones exactly their provider's clients'."""
    for path in sorted((ROOT / "policies").glob("*.yaml")):
        names = credential_variables(path)
        assert names, path.name
        if path.stem in DEMO:
            assert names == ["DEMO_API_KEY"], path.name
            continue
        assert "DEMO_API_KEY" not in names, path.name
        if path.stem in LEGACY:
            assert names == LEGACY[path.stem], path.name


@pytest.mark.parametrize("name", sorted(LEGACY))
def test_a_legacy_policy_names_its_variables_in_its_header(name: str) -> None:
    """The comment a platform team reads first names every variable to set."""
    text = (ROOT / f"policies/{name}.yaml").read_text()
    header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    for variable in LEGACY[name]:
        assert f"${{{variable}}}" in header, (name, variable)
    assert "DEMO_API_KEY" not in header


def test_docs_table_names_what_each_shipped_policy_reads() -> None:
    """docs/providers.md's table of variables is the shipped policies' credentials, row for
    row: every variable a policy reads, with every policy that reads it."""
    read: dict[str, set[str]] = {}
    for path in sorted((ROOT / "policies").glob("*.yaml")):
        for variable in credential_variables(path):
            read.setdefault(variable, set()).add(path.stem)
    assert documented() == read


def test_the_demo_key_alone_no_longer_loads_a_legacy_policy(tmp_path: Path) -> None:
    """An operator who set only DEMO_API_KEY for a legacy policy is told, at load (and so by
    `statusgate check`), which variable to set instead."""
    for name, variables in LEGACY.items():
        with pytest.raises(ConfigError) as raised:
            load_policy(ROOT / f"policies/{name}.yaml", f"{name}.yaml", {"DEMO_API_KEY": "k"})
        for variable in variables:
            assert any(
                line.startswith(f"{name}.yaml: credential.")
                and line.endswith(f"environment variable {variable} is not set")
                for line in raised.value.problems
            ), raised.value.problems
        env = {variable: "k-123456" for variable in variables}
        assert load_policy(ROOT / f"policies/{name}.yaml", name, env).provider == name

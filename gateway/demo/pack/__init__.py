"""The provider pack's doubles: one module per shipped policy of the pack, each a small
provider written from that provider's published API reference (paths, fields, status
values, codes; the module's docstring names the pages), never from our own policy, so a
test that drives the official SDK through the gateway against it proves the policy right.

The demo provider mounts each double under ``/<provider>`` (``DemoProvider.app``), and
``statusgate demo --provider NAME`` submits the double's ``example`` through the gateway.
A double's jobs follow scripts like every demo job (``gateway/demo/jobs.py``): the
``demo_script`` of the submit body when the SDK can send one, else
``DemoProvider.default_scripts[family name]``, else the family's default.

Adding one: a module here defining ``DOUBLE = Double(...)``, and its name in ``MODULES``.
May import ``gateway.demo.jobs`` and aiohttp; never ``gateway.demo.provider`` or the
gateway's runtime packages.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aiohttp import web

    from gateway.demo.jobs import Family, Jobs

# The modules of this package that define a DOUBLE, one per shipped policy of the pack.
MODULES: tuple[str, ...] = (
    "runway",
    "cohere_embed_jobs",
    "replicate",
    "assemblyai",
    "elevenlabs_dubbing",
    "fal_queue",
    "aws_transcribe",
    "bedrock_async_invoke",
    "bedrock_batch",
    "celery_flower",
    "gemini_batch",
    "vertex_batch_prediction",
    "azure_openai_batch",
    "fireworks_batch",
    "groq_batch",
    "mistral_batch",
    "openai_fine_tuning",
    "openai_responses",
    "together_batch",
)


@dataclass(frozen=True)
class Example:
    """One submit as an agent of this provider sends it (``statusgate demo --provider``)."""

    path: str
    """The provider path of the submit, placeholders filled (``/v1/batches``)."""
    body: dict[str, Any] | None = None
    """The JSON body; ``demo_script`` is added to it when the double reads one."""
    headers: dict[str, str] = field(default_factory=dict)
    """Headers besides the agent's credential (``Idempotency-Key`` is added when needed)."""
    method: str = "POST"


@dataclass(frozen=True)
class Double:
    provider: str
    """The shipped policy this double answers for; mounted at ``/<provider>``."""
    reference: str
    """The published API reference it was written from (a URL)."""
    family: Family
    """How its jobs are written and scripted (its name keys ``default_scripts``)."""
    routes: Callable[[Jobs], Iterable[web.AbstractRouteDef]]
    """Its routes, relative to the mount point, served with the demo provider's jobs
    (``Jobs``: new_job, find_job, status, answer, status_body, cancel_job, base...)."""
    example: Example
    """What ``statusgate demo --provider`` submits."""


_LOADED: dict[str, Double] = {}


def doubles() -> dict[str, Double]:
    """Every double of the pack by provider name (imported once, on first use)."""
    if not _LOADED and MODULES:
        for name in MODULES:
            double: Double = importlib.import_module(f"{__name__}.{name}").DOUBLE
            _LOADED[double.provider] = double
    return _LOADED

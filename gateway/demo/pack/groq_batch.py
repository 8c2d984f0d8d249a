"""Groq batches (policy ``groq-batch``), from https://console.groq.com/docs/batch and the
Groq API reference ("Batches", "Files"), which the official ``groq`` SDK follows: the
OpenAI Batch API under ``/openai/v1`` of https://api.groq.com, the key as a bearer token,
ids of the forms ``batch_<ulid>`` and ``file_<ulid>``, the statuses validating,
in_progress, finalizing, completed, failed, expired, cancelling, cancelled.
"""

from __future__ import annotations

from gateway.demo.pack.common import bearer
from gateway.demo.pack.openai_batches import Dialect, double

DOUBLE = double(
    Dialect(
        provider="groq-batch",
        reference="https://console.groq.com/docs/api-reference#batches",
        prefix="/openai/v1",
        auth=bearer,
        file_prefix="file_",
    )
)

"""Azure OpenAI batches (policy ``azure-openai-batch``), from Microsoft Learn's "Azure
OpenAI batch" guide and the Azure OpenAI data-plane REST reference (Batch - Create, Get,
Cancel; Files - Upload, Get Content): the OpenAI Batch API under ``/openai`` of the
resource's endpoint, every call with ``?api-version=`` (a call without one is answered
404 "Resource not found"), the key in the ``api-key`` header, ids of the forms
``batch_<uuid>`` and ``file-<hex>``, the OpenAI Batch statuses.
"""

from __future__ import annotations

from gateway.demo.pack.common import header_key
from gateway.demo.pack.openai_batches import Dialect, double

DOUBLE = double(
    Dialect(
        provider="azure-openai-batch",
        reference="https://learn.microsoft.com/azure/ai-foundry/openai/how-to/batch",
        prefix="/openai",
        auth=header_key("api-key"),
        file_prefix="file-",
        required_query="api-version",
        example_query="?api-version=2024-10-21",
    )
)

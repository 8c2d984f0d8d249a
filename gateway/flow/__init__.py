"""Flow: the workflows of a running gateway, whoever asks. The runtime container
(``runtime``), a poll step by step for any asker (``polls``: a status call, a held call, an
MCP wait, the gateway's own poll), the bound on held calls (``holds``), a cancel sent to
a provider (``cancels``), background lease releases, refusal windows, the deadline sweeper
and purge (``sweep``), live reload (``reloading``).

Answers no HTTP. May import ``gateway.provider`` and the layers below it.
"""

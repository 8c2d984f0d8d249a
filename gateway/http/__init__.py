"""HTTP: agents' routes as a thin shell over the flow layer. The agent lane (a
hand-written HTTP/1.1 server for ``/p/...`` calls) and its listener, the one middleware
(``gate``), authentication, routing to submit, status, result, cancel and passthrough, and
answers rendered from decisions (``answers``, ``problems``).

Decides no rule itself (``gateway.core`` does). May import ``gateway.flow`` and the layers
below it.
"""

"""Operator: the people's side. The operator API (``admin``: operations, escalations
and their decisions, reload), the web console (``console/``, static files calling that API),
the OpenAPI document of the gateway's surface, and ``policy test``.

May import ``gateway.http`` and the layers below it; never ``gateway.http.mcp``.
"""

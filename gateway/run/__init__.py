"""The process: what turns settings into a running gateway, and the command line.

``app`` wires the store, the upstream client, flow and the HTTP routes into one aiohttp
application; ``server`` runs it (listeners, TLS, reload, shutdown); ``workers`` runs it in
several processes; ``shipped`` holds the files ``statusgate init`` writes; ``cli`` is the
``statusgate`` command (``python -m gateway.run``).

Imports: every layer below (settings, core, store, observe, provider, flow, http, operator).
``gateway.demo`` sits between ``app``/``server``/``workers``/``shipped`` and ``cli``: the demo
builds on the wiring and the command line offers the demo, so only ``cli`` imports it.
"""

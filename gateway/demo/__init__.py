"""Demo: the shipped fake provider and the shows. ``provider`` (the five demo families
and the provider pack's doubles of ``pack/``, each also under ``/<provider>``), ``jobs``
(their scripted jobs), ``walkthrough`` (``statusgate demo``), ``showcase`` (``statusgate demo
--provider NAME``), ``env`` (the demo's credentials).

Not runtime code: nothing of the gateway imports it. May import every layer below the
command line (it starts a gateway of its own).
"""

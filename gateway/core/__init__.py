"""Core: every rule of the contract as pure functions and data. The state table and
the decision steps of a status call (``decide``), the schedule (``schedule``), the pacing
window (``pacing``), operator actions (``actions``), escalations, effects of a step as data
(``effects``), the problem table (``problems``), routing of an agent path (``routing``).

Pure: no I/O, no clock, no asyncio, no randomness of its own (time and random values are
arguments); ``tests/test_layers.py`` checks its imports. May import ``gateway.settings`` and
``gateway`` only.
"""

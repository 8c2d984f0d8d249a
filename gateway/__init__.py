"""Statusgate: a policy gateway between AI agents and asynchronous provider jobs."""

__version__ = "0.2.0"

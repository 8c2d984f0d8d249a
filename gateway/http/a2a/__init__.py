"""Agents' A2A interface (SPEC 24): the card, the JSON-RPC and HTTP+JSON bindings and the
push target under /a2a/{provider}, a thin shell over the provider machinery (calls.py)."""

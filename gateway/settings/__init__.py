"""Settings: the gateway config and the provider policies, from YAML to frozen, validated
objects (``load_settings``, ``load_policy``), with ``${ENV}`` interpolation and one
``file: field: message`` line per problem.

Reads its files and the environment, nothing else. May import only ``gateway``: every
other layer builds on it, so it knows none of them.
"""

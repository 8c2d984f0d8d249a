"""Operator roles (SPEC 25): what each role may do, and the role and name a signed-in
person's token claims give them.

Pure: the claims come from a token already verified elsewhere; nothing here reads a clock
or the network.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.settings.config import ROLES, OidcSettings, Role

# The least role each operator-API capability needs; a role may do what every role before
# it in ROLES may do.
NEEDS: Mapping[str, Role] = {
    "read": "viewer",  # list and show operations, the escalation queue, the story
    "decide": "decider",  # extend, cancel at the provider, abandon, resume
    "reload": "admin",
    "keys": "admin",
}
ID_CLAIMS = ("preferred_username", "email", "sub")  # the first present names the person


def allows(have: Role, need: Role) -> bool:
    """Whether ``have`` may do what ``need`` may."""
    return ROLES.index(have) >= ROLES.index(need)


def capabilities(role: Role) -> dict[str, bool]:
    """Each capability of NEEDS and whether ``role`` has it (what the console shows)."""
    return {name: allows(role, need) for name, need in NEEDS.items()}


def claim(claims: Mapping[str, Any], name: str) -> Any:
    """The claim ``name``: a top-level claim of that exact name first (claim names such as
    ``https://example.com/roles`` contain dots), else a dotted path into objects
    (``realm_access.roles``); None when absent."""
    if name in claims:
        return claims[name]
    value: Any = claims
    for part in name.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def role_from_claims(claims: Mapping[str, Any], oidc: OidcSettings) -> Role:
    """admin if a value of the roles claim is one of ``roles.admin``, else decider if one
    is in ``roles.decider``, else viewer. The claim may be a list or a single string."""
    found = claim(claims, oidc.roles_claim)
    values = {found} if isinstance(found, str) else set(found) if isinstance(found, list) else set()
    values = {v for v in values if isinstance(v, str)}
    if values & set(oidc.roles.admin):
        return "admin"
    if values & set(oidc.roles.decider):
        return "decider"
    return "viewer"


def person(claims: Mapping[str, Any]) -> str | None:
    """The name audit lines give a signed-in person: preferred_username, else email, else
    the subject; None if the token names nobody."""
    for name in ID_CLAIMS:
        value = claims.get(name)
        if isinstance(value, str) and value.strip():
            return value.strip()[:200]
    return None

"""A policy's ``push:`` section (SPEC 23): how the provider's webhooks are verified and
read. Frozen settings only; never verifies a request (provider/pushes.py does) and never
reads a body (core/pushes.py does).

Pushes are on when the verification secret (or JWKS URL) is set: the shipped policies name
theirs as ``${NAME:-}``, so a deployment without the provider's webhook secret keeps polling
as before rather than failing to load.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gateway.settings.fields import HeaderName
from gateway.settings.loading import Duration, Strict, http_url

Scheme = Literal["standard-webhooks", "hmac-sha256", "ed25519-jwks", "header-secret"]


class Verify(Strict):
    """How a push proves it comes from the provider; ``scheme`` says which fields apply."""

    scheme: Scheme
    """standard-webhooks (OpenAI, Replicate), hmac-sha256, ed25519-jwks (fal) or
    header-secret (AssemblyAI)."""
    secret: str | None = Field(default=None, repr=False)
    """The signing secret (standard-webhooks: the provider's ``whsec_...``; hmac-sha256: the
    HMAC key; header-secret: the header's expected value). Empty: pushes are off."""
    header: HeaderName | None = None
    """hmac-sha256: the header carrying the signature; header-secret: the header carrying
    the secret."""
    encoding: Literal["hex", "base64"] = "hex"
    """hmac-sha256: how the signature is written in its header."""
    prefix: str = ""
    """hmac-sha256: text before the signature in its header ("sha256=")."""
    timestamp_header: HeaderName | None = None
    """hmac-sha256: a header with the push's Unix time, checked against ``tolerance`` and
    signed as ``<timestamp>.<body>``; unset: the body alone is signed."""
    jwks_url: str | None = None
    """ed25519-jwks: where the provider publishes its public keys (fal:
    https://rest.alpha.fal.ai/.well-known/jwks.json)."""
    tolerance: Duration = 300.0
    """How far a push's timestamp may be from the gateway's clock ("5m")."""
    id_header: HeaderName | None = None
    """standard-webhooks only: the header naming the delivery (default webhook-id), which
    its signature covers. The other schemes key replay protection on what their signature
    covers: hmac-sha256 the signed bytes' sha256, ed25519-jwks the signed request id,
    header-secret the body's sha256 (an unsigned id header could be changed to replay)."""

    def problems(self) -> list[tuple[str, str]]:
        """The fields the scheme needs, as (field path, message) pairs."""
        where = "push.verify"
        needs = {
            "standard-webhooks": ["secret"],
            "hmac-sha256": ["secret", "header"],
            "ed25519-jwks": ["jwks_url"],
            "header-secret": ["secret", "header"],
        }[self.scheme]
        found = [
            (f"{where}.{name}", f"is required for scheme {self.scheme}")
            for name in needs
            if getattr(self, name) is None
        ]
        if self.jwks_url:
            try:
                http_url(self.jwks_url)
            except ValueError as exc:
                found.append((f"{where}.jwks_url", str(exc)))
        if self.tolerance <= 0:
            found.append((f"{where}.tolerance", "must be greater than 0"))
        return found

    @property
    def on(self) -> bool:
        """A secret (or key source) is set: pushes are accepted."""
        return bool(self.jwks_url if self.scheme == "ed25519-jwks" else self.secret)


class PushJobId(Strict):
    path: str
    """The dotted path of the provider's job id in the push body (data.id)."""


class PushState(Strict):
    """Where the push says the job's state: a ``path`` in the body, or the event name at
    ``event_path`` mapped through ``events``. Neither found: a thin push (one poll)."""

    path: str | None = None
    """The dotted path of the state in the push body (status)."""
    events: dict[str, str] = {}
    """Event names mapped to the provider's states ({batch.completed: completed})."""
    event_path: str = "type"
    """Where the event name is in the push body."""


class Push(Strict):
    verify: Verify
    """How a push is authenticated."""
    job_id: PushJobId
    """Which job a push is about."""
    state: PushState = PushState()
    """Which state a push reports, if any."""
    object: str | None = None
    """Where in the push the job's status object is, as the status route answers it (``.``:
    the whole body, as Replicate sends the prediction). Unset: the push carries none, so a
    push reporting an end is thin (one poll), as OpenAI's and AssemblyAI's are."""
    fallback_delay: Duration = 600.0
    """While pushes are on, a pending answer's next poll is at least this far away."""

    def problems(self) -> list[tuple[str, str]]:
        """Cross-field rules of the section."""
        found = self.verify.problems()
        if self.state.path is not None and self.state.events:
            found.append(("push.state", "name a path or events, not both"))
        if self.fallback_delay <= 0:
            found.append(("push.fallback_delay", "must be greater than 0"))
        return found

    @property
    def on(self) -> bool:
        """Pushes are accepted (the verification secret is set)."""
        return self.verify.on

"""The policy's credential (SPEC 3, 12): which kind, its fields, its fingerprint and the
secret strings that must never reach anyone. Never contacts a provider (provider/credentials.py
puts it on requests)."""

from __future__ import annotations

import json
from typing import Literal

import pydantic
from pydantic import Field

from gateway.settings.fields import HeaderName, digest
from gateway.settings.loading import Strict, http_url


class AwsSigV4(Strict):
    service: str
    """The AWS service name in the signature (transcribe, s3...)."""
    region: str
    """The AWS region in the signature (us-east-1)."""
    access_key_id: str = Field(repr=False)
    """The access key id, usually ${AWS_ACCESS_KEY_ID}."""
    secret_access_key: str = Field(repr=False)
    """The secret access key, usually ${AWS_SECRET_ACCESS_KEY} or ${file:/path}."""
    session_token: str | None = Field(default=None, repr=False)
    """A session token for temporary credentials, if any."""


class OAuth2ClientCredentials(Strict):
    token_url: str
    """The token endpoint (http or https URL)."""
    client_id: str = Field(repr=False)
    """The OAuth2 client id."""
    client_secret: str = Field(repr=False)
    """The OAuth2 client secret, from ${ENV} or ${file:/path}."""
    scope: str | None = None
    """The scope asked for, if the provider wants one."""

    @pydantic.field_validator("token_url")
    @classmethod
    def _token_url(cls, value: str) -> str:
        return http_url(value)


CredentialKind = Literal["header", "query", "aws_sigv4", "oauth2_client_credentials"]


class Credential(Strict):
    """One of: {header, value}; {query, value}; {aws_sigv4}; {oauth2_client_credentials,
    header}. Which one is checked by cross_check, so the message names the fields."""

    header: HeaderName | None = None
    """The request header that carries the credential (Authorization)."""
    query: str | None = None
    """The query parameter that carries the credential (an API key in the URL)."""
    value: str | None = Field(default=None, repr=False)
    """The header or query value, e.g. "Bearer ${ACME_API_KEY}"; never shown to agents."""
    aws_sigv4: AwsSigV4 | None = None
    """Sign every provider request with AWS Signature Version 4."""
    oauth2_client_credentials: OAuth2ClientCredentials | None = None
    """Fetch, cache and renew an OAuth2 client-credentials token."""

    @property
    def kind(self) -> CredentialKind:
        if self.aws_sigv4 is not None:
            return "aws_sigv4"
        if self.oauth2_client_credentials is not None:
            return "oauth2_client_credentials"
        return "query" if self.query is not None else "header"

    def problems(self) -> list[tuple[str, str]]:
        kinds = [
            name
            for name, present in (
                ("query", self.query is not None),
                ("aws_sigv4", self.aws_sigv4 is not None),
                ("oauth2_client_credentials", self.oauth2_client_credentials is not None),
            )
            if present
        ]
        if len(kinds) > 1:
            return [("credential", f"choose one kind of credential, not {' and '.join(kinds)}")]
        kind = self.kind
        if kind in ("header", "query") and self.value is None:
            return [("credential.value", "is required")]
        if kind == "header" and self.header is None:
            return [("credential.header", "is required")]
        if kind == "query" and self.header is not None:
            return [("credential.header", "a query credential takes no header")]
        if kind in ("aws_sigv4", "oauth2_client_credentials") and self.value is not None:
            return [("credential.value", f"{kind} takes no value")]
        if kind == "aws_sigv4" and self.header is not None:
            return [("credential.header", "aws_sigv4 signs the Authorization header itself")]
        return []

    @property
    def secrets(self) -> tuple[str, ...]:
        """The static secret strings of this credential (never shown to anyone)."""
        found: list[str] = []
        if self.value is not None:
            scheme, _, token = self.value.partition(" ")
            found.append(self.value)
            if token and scheme.isalpha():
                found.append(token)
        if self.aws_sigv4 is not None:
            aws = self.aws_sigv4
            found += [aws.access_key_id, aws.secret_access_key, aws.session_token or ""]
        if self.oauth2_client_credentials is not None:
            found.append(self.oauth2_client_credentials.client_secret)
        return tuple(p for p in found if len(p) >= 6)

    @property
    def fingerprint(self) -> str:
        """Changes whenever the credential changes, without revealing it."""
        if self.kind == "header":  # the first edition's formula: stored records keep theirs
            return digest(f"{self.header}\n{self.value}")
        return digest(json.dumps(self.model_dump(mode="json"), sort_keys=True))

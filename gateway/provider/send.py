"""One request to a provider, as the core sees it: the credential put on (and renewed once
on a 401), counted, timed and traced. It takes the client, the credential applier and the
metrics it needs (a ``Channel``), never the runtime; answers to agents are built in
gateway/http/answers.py."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from gateway import UpstreamBodyTooLarge, UpstreamTimeout, UpstreamUnavailable
from gateway.core.models import Failure, ProviderAnswer
from gateway.observe import tracing
from gateway.observe.context import CURRENT, note_provider_call
from gateway.observe.metrics import Metrics, status_class
from gateway.provider.client import Upstream, UpstreamResponse
from gateway.provider.credentials import Applier, Outgoing
from gateway.settings.policy import ProviderPolicy

# Routes whose every request is counted (a status request spends a reservation, a result
# fetch one of max_result_fetches): never sent twice by the client for one count.
COUNTED = frozenset({"status", "result"})


@dataclass(frozen=True, slots=True)
class Channel:
    """What sending to one provider needs: the client, the policy's credential applier and
    the metrics the call is counted in."""

    client: Upstream
    credential: Applier
    metrics: Metrics


async def send_upstream(
    channel: Channel,
    policy: ProviderPolicy,
    route: str,
    method: str,
    url: str,
    headers: dict[str, str],
    body: bytes | None = None,
    *,
    operation_id: str | None = None,
) -> tuple[ProviderAnswer, UpstreamResponse | None]:
    """One upstream request as the core sees it (plus the raw answer when there is one),
    counted, timed and traced. ``headers`` come from headers.to_provider; the policy's
    credential is put on here."""
    metrics = channel.metrics
    started = time.perf_counter()
    headers = dict(headers)
    with tracing.client_span(f"{method} {route}", headers) as span:
        if span.recording:
            host, port, path = _server(url, policy.upstream)
            context = CURRENT.get()
            span.update(
                {
                    "http.request.method": method,
                    "server.address": host,
                    "server.port": port,
                    "url.path": path,  # never the query: it may hold a key
                    "statusgate.provider": policy.provider,
                    "statusgate.route": route,
                    "statusgate.operation_id": operation_id,  # none yet at submit
                    "statusgate.account": context.account if context else None,
                }
            )
        response, failure = await _exchange(channel, route, Outgoing(method, url, headers, body))
        if response is not None:
            span.update({"http.response.status_code": response.status})
            if response.status >= 400:  # an error for a client span (semantic conventions)
                span.failed(f"answered {response.status}", str(response.status))
        else:
            span.update({"error.type": failure.value if failure is not None else "error"})
            span.failed("no usable answer from the provider")
    elapsed = time.perf_counter() - started
    metrics.histogram("upstream_duration", policy.provider, route).observe(elapsed)
    status = response.status if response is not None else None
    label = status_class(status, failure.value if failure is not None else None)
    metrics.counter("upstream_requests", policy.provider, route, label).inc()
    note_provider_call(status, elapsed)
    if response is None or failure is Failure.CREDENTIAL_RENEWED:
        return ProviderAnswer(None, failure=failure), None
    answer = ProviderAnswer(
        status=response.status,
        body=response.body,
        content_type=response.content_type,
        retry_after=response.headers.get("Retry-After"),
    )
    return answer, response


async def _exchange(
    channel: Channel, route: str, request: Outgoing
) -> tuple[UpstreamResponse | None, Failure | None]:
    """Send with the credential on. A 401 to an OAuth2 token renews it: any other call is
    sent once more with the new token (it was refused, nothing happened at the provider);
    a status call is not, since every status request sent counts against the budget: it
    reports ``CREDENTIAL_RENEWED`` (a transport failure) and the next permitted poll uses
    the new token."""
    credential = channel.credential
    attempts = 1 if route == "status" else 2
    response: UpstreamResponse | None = None
    try:
        for _ in range(attempts):
            response = None
            out = await credential.apply(request)
            response = await channel.client.send(
                out.method,
                out.url,
                out.headers,
                out.body,
                secrets=credential.secrets(),
                retry=route not in COUNTED,
            )
            if response.status != 401 or not credential.renew():
                return response, None
        renewed = route == "status"
        return response, Failure.CREDENTIAL_RENEWED if renewed else None
    except UpstreamTimeout:
        return None, Failure.TIMEOUT
    except UpstreamBodyTooLarge:
        return None, Failure.TOO_LARGE
    except UpstreamUnavailable as exc:
        return None, Failure.CONNECTION if exc.sent else Failure.UNREACHABLE


def _server(url: str, upstream: str) -> tuple[str | None, int, str]:
    """Host, port and path (without the query) of a provider call: the provider's part
    parsed once, the rest cut from ``url``."""
    if not url.startswith(upstream):
        return _origin(url.split("?", 1)[0])
    host, port, base = _origin(upstream)
    return host, port, base + url[len(upstream) :].split("?", 1)[0]


@functools.lru_cache(maxsize=64)
def _origin(url: str) -> tuple[str | None, int, str]:
    parts = urlsplit(url)
    return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80), parts.path

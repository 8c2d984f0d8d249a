"""Job ids that are AWS ARNs (``routes.job_ids: aws-arn``, SPEC 22): how boto3 sends them
and how they key one operation.

boto3 puts an ARN in one URI segment percent-encoded (``:`` as ``%3A``, ``/`` as ``%2F``),
so the segment is decoded once here and the result must be an ARN of safe characters or a
plain SPEC 11 id; nothing decoded is ever a path of its own. The operation is keyed by the
ARN exactly as the provider gave it (it is what every provider call must name: Bedrock's
GetAsyncInvoke takes nothing else); the ARN's trailing id (``.../abc123``) is the
operation's alias, indexed with it, so either reaches the same operation.

Pure: no I/O.
"""

from __future__ import annotations

import re
from urllib.parse import quote, unquote

PLAIN = re.compile(r"[A-Za-z0-9._~-]{1,200}")
ARN = re.compile(
    r"arn:[a-z][a-z0-9-]{0,31}:[a-z0-9][a-z0-9-]{0,62}:[a-z0-9-]{0,31}:[0-9]{0,12}:(.+)"
)
RESOURCE = re.compile(r"[A-Za-z0-9._~:/+=,@-]{1,400}")
SAFE = "-._~"  # what botocore leaves unencoded in a URI label


def plain(value: str) -> bool:
    """One SPEC 11 segment: ``[A-Za-z0-9._~-]{1,200}``, not ``.`` or ``..``."""
    return PLAIN.fullmatch(value) is not None and value not in (".", "..")


def arn(value: str) -> bool:
    """An ARN whose resource part is safe characters, with no empty, ``.`` or ``..``
    segment between its slashes."""
    found = ARN.fullmatch(value)
    if found is None or RESOURCE.fullmatch(found.group(1)) is None:
        return False
    return all(part not in ("", ".", "..") for part in found.group(1).split("/"))


def valid(value: str) -> bool:
    """A job id of an aws-arn policy: an ARN, or a plain id (an ARN's trailing id)."""
    return plain(value) or arn(value)


def decoded(segment: str) -> str:
    """One raw path segment decoded once; anything still encoded after that stays, so
    ``valid`` refuses it (``%`` is in neither form)."""
    try:
        return unquote(segment, errors="strict")
    except UnicodeDecodeError:
        return segment


def encoded(job_id: str) -> str:
    """A job id as boto3 puts it in one path segment (plain ids are unchanged)."""
    return quote(job_id, safe=SAFE)


def alias(job_id: str) -> str | None:
    """The trailing id of an ARN job id, by which an agent may name it too; None for a
    plain id or an ARN whose last segment is not a plain id."""
    if not arn(job_id):
        return None
    tail = job_id.rsplit("/", 1)[-1].rsplit(":", 1)[-1]
    return tail if plain(tail) and tail != job_id else None

"""What the AWS doubles of the pack share: Signature Version 4 checked as AWS checks it, and
errors written as AWS writes them. Not a double itself (not in ``MODULES``).

A request is authorised when its ``Authorization`` is an ``AWS4-HMAC-SHA256`` signature by
the access key id the demo provider holds (its ``api_key``), for the double's service, and
the signature recomputes, with botocore's signer, over the request as received (the
headers it names, the raw path, the body) with the same key as secret: the shipped
policies' ``${AWS_ACCESS_KEY_ID}`` and ``${AWS_SECRET_ACCESS_KEY}`` are both set to the
demo key. References: "Signature Version 4 signing process"
(https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_sigv.html) and "Common
errors" (https://docs.aws.amazon.com/bedrock/latest/APIReference/CommonErrors.html).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

BODY = web.RequestKey("aws_body", bytes)  # the body a double's handler read


async def read_body(request: web.Request) -> bytes:
    """The request's body, kept on the request for the signature check."""
    if BODY not in request:
        request[BODY] = await request.read()
    body: bytes = request[BODY]
    return body


def signed_by(request: web.Request, key: str, service: str) -> bool:
    """Is this request signed with SigV4 by ``key`` (key id and secret) for ``service``?
    The handler must have called ``read_body`` first when the request has a body."""
    authorization = request.headers.get("Authorization", "")
    prefix = "AWS4-HMAC-SHA256 Credential="
    if not authorization.startswith(prefix) or "X-Amz-Date" not in request.headers:
        return False
    fields = dict(
        part.strip().split("=", 1) for part in authorization[len("AWS4-HMAC-SHA256 ") :].split(",")
    )
    scope = fields.get("Credential", "").split("/")
    if len(scope) != 5 or scope[0] != key or scope[3] != service or scope[4] != "aws4_request":
        return False
    names = fields.get("SignedHeaders", "").split(";")
    headers = {k: v for k, v in request.headers.items() if k.lower() in names}
    url = f"{request.scheme}://{request.host}{request.raw_path}"
    aws = AWSRequest(method=request.method, url=url, data=request.get(BODY, b""), headers=headers)
    aws.context["timestamp"] = request.headers["X-Amz-Date"]
    signer = SigV4Auth(Credentials(key, key), service, scope[2])
    expected: str = signer.signature(signer.string_to_sign(aws, signer.canonical_request(aws)), aws)
    return fields.get("Signature") == expected


def error(kind: str, message: str, status: int = 400, *, json_1_1: bool = False) -> web.Response:
    """An AWS error answer: the REST-JSON form (``x-amzn-ErrorType`` and ``message``), or
    the JSON 1.1 form of the JSON-RPC services (``__type`` in the body)."""
    body: dict[str, Any] = {"message": message}
    content_type = "application/json"
    if json_1_1:
        body = {"__type": kind, "Message": message}
        content_type = "application/x-amz-json-1.1"
    return web.json_response(
        body, status=status, headers={"x-amzn-ErrorType": kind}, content_type=content_type
    )


def denied(*, json_1_1: bool = False) -> web.Response:
    """AWS's answer to a request whose signature does not check out."""
    return error(
        "InvalidSignatureException",
        "The request signature we calculated does not match the signature you provided.",
        403,
        json_1_1=json_1_1,
    )

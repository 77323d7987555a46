"""API keys: LIDARSEG_API_KEYS checked in constant time, for /v1/*, the dashboard and /docs."""

from __future__ import annotations

import base64
import binascii
import hmac

from fastapi import Request

from app.service.config import Settings
from app.service.state import ServiceError


def key_valid(authorization: str, keys: tuple[str, ...]) -> bool:
    """Whether an Authorization header carries one of `keys` (Bearer, or Basic with the key as
    the password); compared with every key in constant time."""
    scheme, _, text = authorization.partition(" ")
    token = text.strip().encode()
    if scheme.lower() == "basic":  # a browser (the dashboard): any user name, the key as password
        try:
            token = base64.b64decode(token, validate=True).partition(b":")[2]
        except (binascii.Error, ValueError):
            token = b""
        scheme = "bearer"
    ok = False
    if scheme.lower() == "bearer" and token:
        for key in keys:  # compare with every key: timing does not reveal which
            ok |= hmac.compare_digest(token, key.encode())
    return ok


def unauthorized() -> ServiceError:
    """401; it closes the connection (the body is never read)."""
    return ServiceError(
        401,
        "unauthorized",
        "missing or invalid API key (Authorization: Bearer <key>)",
        {"WWW-Authenticate": "Bearer", "Connection": "close"},
    )


def require_api_key(request: Request, settings: Settings) -> None:
    """Authorization: Bearer <key> when LIDARSEG_API_KEYS is set (constant-time compare)."""
    if settings.api_keys and not key_valid(
        request.headers.get("authorization", ""), settings.api_keys
    ):
        raise unauthorized()

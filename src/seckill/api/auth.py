"""Who is asking: a bearer token names a buyer or an admin (see seckill.security.tokens)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from seckill.api.context import context
from seckill.api.errors import ApiError
from seckill.bootstrap.services import Context
from seckill.domain.outcomes import ApiRefusal
from seckill.security.tokens import Identity, InvalidToken, Role, TokenCodec

# auto_error off: a missing token gets our error body (401), not the framework's.
_bearer = HTTPBearer(auto_error=False, description="A JWT minted by `seckill token`.")


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, read as the framework's
    ``HTTPBearer`` reads it (for the route served without the framework)."""
    scheme, _, token = (authorization or "").partition(" ")
    token = token.strip()
    return token if token and scheme.lower() == "bearer" else None


def authorize(tokens: TokenCodec, token: str | None, role: Role) -> Identity:
    """The caller of a route for ``role``: 401 without a valid token, 403 with another role's."""
    if token is None:
        raise InvalidToken("a bearer token is required")
    identity = tokens.verify(token)
    if identity.role is not role:
        raise ApiError(403, ApiRefusal.FORBIDDEN, f"this route is for {role.value}s")
    return identity


def _require(role: Role) -> object:
    async def check(
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
        ctx: Annotated[Context, Depends(context)],
    ) -> Identity:
        return authorize(ctx.tokens, credentials.credentials if credentials else None, role)

    return check


BuyerIdentity = Annotated[Identity, Depends(_require(Role.BUYER))]
AdminIdentity = Annotated[Identity, Depends(_require(Role.ADMIN))]

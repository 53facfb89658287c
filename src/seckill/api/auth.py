"""Who is asking: a bearer token names a buyer or an admin (see seckill.security.tokens)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from seckill.api.context import Context, context
from seckill.api.errors import ApiError
from seckill.security.tokens import Identity, InvalidToken, Role

# auto_error off: a missing token gets our error body (401), not the framework's.
_bearer = HTTPBearer(auto_error=False, description="A JWT minted by `seckill token`.")


async def _identity(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    ctx: Annotated[Context, Depends(context)],
) -> Identity:
    if credentials is None:
        raise InvalidToken("a bearer token is required")
    return ctx.tokens.verify(credentials.credentials)


def _require(role: Role) -> object:
    async def check(identity: Annotated[Identity, Depends(_identity)]) -> Identity:
        if identity.role is not role:
            raise ApiError(403, "forbidden", f"this route is for {role.value}s")
        return identity

    return check


BuyerIdentity = Annotated[Identity, Depends(_require(Role.BUYER))]
AdminIdentity = Annotated[Identity, Depends(_require(Role.ADMIN))]

"""``seckill token``: a bearer token minted with the deployment's own key, for tests and demos."""

from __future__ import annotations

import typer

from seckill.cli.common import (
    abort,
    checked_settings,
    setting_default,
)

commands = typer.Typer()


@commands.command()
def token(
    buyer: str | None = typer.Option(None, help="Mint a buyer token for this buyer id."),
    admin: bool = typer.Option(False, "--admin", help="Mint an admin token."),
    ttl: int | None = typer.Option(
        None, min=1, help=f"Seconds ({setting_default('token_ttl_seconds')})."
    ),
) -> None:
    """Print a bearer token, for tests and demos.

    Production tokens come from your identity provider, signed with the same key.
    """
    from seckill.bootstrap.keys import token_codec
    from seckill.domain.outcomes import InvalidRequest
    from seckill.security.tokens import Role

    if (buyer is None) == (not admin):
        abort("give exactly one of --buyer ID or --admin")
    settings = checked_settings()
    subject, role = (buyer, Role.BUYER) if buyer is not None else ("admin", Role.ADMIN)
    try:
        minted = token_codec(settings).mint(
            subject, role, ttl_seconds=ttl or settings.token_ttl_seconds
        )
    except (ValueError, InvalidRequest) as exc:
        abort(exc)
    print(minted)

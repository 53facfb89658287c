"""The API as the crowd sees it: one aiohttp session, tokens minted per buyer, signed notices.

Every call answers a ``Reply`` already read and timed; a request that got no HTTP answer at all
(refused, reset, timed out) is a ``Reply`` with status 0 and outcome ``transport_error``, so a
crowd counts it instead of dying of it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import aiohttp

from seckill.domain.money import Money
from seckill.security.passes import PASS_HEADER
from seckill.security.signatures import SIGNATURE_HEADER, sign
from seckill.security.tickets import TICKET_HEADER
from seckill.security.tokens import Role, TokenCodec

TRANSPORT_ERROR = "transport_error"
_TOKEN_TTL_S = 3_600


@dataclass(frozen=True, slots=True)
class Reply:
    status: int  # 0: no HTTP answer
    body: dict[str, Any]
    ms: float

    @property
    def outcome(self) -> str:
        """The error's code (``sold_out``, ``rate_limited``...), else what the body says: its
        outcome, status, or (a waiting room's answer) state."""
        if self.status == 0:
            return TRANSPORT_ERROR
        if self.status >= 400:
            return str(self.body.get("error") or f"http_{self.status}")
        said = self.body.get("outcome") or self.body.get("status") or self.body.get("state")
        return str(said or f"http_{self.status}")


@dataclass(slots=True, kw_only=True)
class Credentials:
    """What a crowd needs to act for everyone: mint buyer tokens, be an admin, sign notices."""

    tokens: TokenCodec
    payment_secret: str | bytes
    admin_token: str | None = None
    _minted: dict[str, str] = field(default_factory=dict)

    def buyer(self, name: str) -> str:
        token = self._minted.get(name)
        if token is None:
            token = self._minted[name] = self.tokens.mint(
                name, Role.BUYER, ttl_seconds=_TOKEN_TTL_S
            )
        return token

    def admin(self) -> str:
        if self.admin_token is None:
            self.admin_token = self.tokens.mint("crowd", Role.ADMIN, ttl_seconds=_TOKEN_TTL_S)
        return self.admin_token


class ApiClient:
    def __init__(
        self, session: aiohttp.ClientSession, base_url: str, credentials: Credentials
    ) -> None:
        self.session = session
        self.base_url = base_url.rstrip("/")
        self.credentials = credentials

    async def request(
        self,
        method: str,
        path: str,
        *,
        token: str | None = None,
        body: Any = None,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        sent = dict(headers or {})
        if token is not None:
            sent["Authorization"] = f"Bearer {token}"
        if body is not None:
            raw = json.dumps(body).encode()
        if raw is not None:
            sent["Content-Type"] = "application/json"
        started = time.perf_counter()
        try:
            async with self.session.request(
                method, self.base_url + path, data=raw, headers=sent
            ) as response:
                data = await response.read()
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            why = {"error": TRANSPORT_ERROR, "message": str(exc) or type(exc).__name__}
            return Reply(0, why, (time.perf_counter() - started) * 1000)
        ms = (time.perf_counter() - started) * 1000
        try:
            parsed = json.loads(data) if data else {}
        except ValueError:
            parsed = {"error": f"http_{status}", "message": data[:200].decode(errors="replace")}
        return Reply(status, parsed if isinstance(parsed, dict) else {"value": parsed}, ms)

    # The operator's side.

    async def health(self) -> Reply:
        return await self.request("GET", "/healthz")

    async def create_item(
        self,
        *,
        name: str,
        total: int,
        per_buyer_limit: int,
        hold_seconds: int,
        starts_at: datetime,
        ends_at: datetime,
        price_cents: int = 9_900,
        currency: str | None = None,
        waiting_room: bool = False,
        queue_admit_per_second: int | None = None,
    ) -> Reply:
        """Create an item, priced in ``currency`` (None: the deployment's default): with
        ``waiting_room``, its buyers queue first, let in at ``queue_admit_per_second`` (None:
        the deployment's pace)."""
        optional: dict[str, object] = {"waiting_room": waiting_room}
        if queue_admit_per_second is not None:
            optional["queue_admit_per_second"] = queue_admit_per_second
        if currency is not None:
            optional["currency"] = currency
        return await self.request(
            "POST",
            "/api/v1/admin/items",
            token=self.credentials.admin(),
            body={
                "name": name,
                "price_cents": price_cents,
                "total": total,
                "starts_at": starts_at.isoformat(),
                "ends_at": ends_at.isoformat(),
                "per_buyer_limit": per_buyer_limit,
                "hold_seconds": hold_seconds,
                **optional,
            },
        )

    async def warm(self, item_id: int) -> Reply:
        path = f"/api/v1/admin/items/{item_id}/warm"
        return await self.request("POST", path, token=self.credentials.admin())

    async def end_sale(self, item_id: int) -> Reply:
        path = f"/api/v1/admin/items/{item_id}/end"
        return await self.request("POST", path, token=self.credentials.admin())

    async def counters(self, item_id: int) -> Reply:
        path = f"/api/v1/admin/items/{item_id}"
        return await self.request("GET", path, token=self.credentials.admin())

    async def audit(self, item_id: int) -> Reply:
        path = f"/api/v1/admin/items/{item_id}/audit"
        return await self.request("GET", path, token=self.credentials.admin())

    async def refunds(self, item_id: int) -> list[dict[str, Any]] | None:
        """Every refund of the item, all pages; None if the route did not answer."""
        found: list[dict[str, Any]] = []
        cursor = ""
        while True:
            path = f"/api/v1/admin/refunds?item_id={item_id}&limit=500{cursor}"
            page = await self.request("GET", path, token=self.credentials.admin())
            if page.status != 200:
                return None
            found += page.body["refunds"]
            if page.body.get("next_cursor") is None:
                return found
            cursor = f"&cursor={page.body['next_cursor']}"

    async def queue_report(self, item_id: int) -> Reply:
        path = f"/api/v1/admin/items/{item_id}/queue"
        return await self.request("GET", path, token=self.credentials.admin())

    # A buyer's side.

    async def join_queue(self, item_id: int, buyer: str) -> Reply:
        path = f"/api/v1/items/{item_id}/queue"
        return await self.request("POST", path, token=self.credentials.buyer(buyer))

    async def queue_standing(self, item_id: int, buyer: str, *, queue_pass: str) -> Reply:
        return await self.request(
            "GET",
            f"/api/v1/items/{item_id}/queue",
            token=self.credentials.buyer(buyer),
            headers={PASS_HEADER: queue_pass},
        )

    async def ticket(self, item_id: int, buyer: str) -> Reply:
        path = f"/api/v1/items/{item_id}/tickets"
        return await self.request("POST", path, token=self.credentials.buyer(buyer))

    async def buy(self, item_id: int, buyer: str, *, ticket: str, key: str, quantity: int) -> Reply:
        return await self.request(
            "POST",
            f"/api/v1/items/{item_id}/orders",
            token=self.credentials.buyer(buyer),
            body={"quantity": quantity},
            headers={"Idempotency-Key": key, TICKET_HEADER: ticket},
        )

    async def order(self, buyer: str, item_id: int, order_id: str) -> Reply:
        path = f"/api/v1/items/{item_id}/orders/{order_id}"
        return await self.request("GET", path, token=self.credentials.buyer(buyer))

    async def cancel(self, buyer: str, item_id: int, order_id: str) -> Reply:
        path = f"/api/v1/items/{item_id}/orders/{order_id}/cancel"
        return await self.request("POST", path, token=self.credentials.buyer(buyer))

    # The payment provider's side.

    async def notify_payment(
        self, item_id: int, order_id: str, *, payment_id: str, succeeded: bool, amount: Money
    ) -> Reply:
        """A signed notice that the provider charged ``amount`` for the order (or failed to)."""
        notice = {
            "payment_id": payment_id,
            "item_id": item_id,
            "order_id": order_id,
            "status": "succeeded" if succeeded else "failed",
            "amount": amount.cents,
            "currency": amount.currency,
        }
        raw = json.dumps(notice).encode()
        signature = sign(self.credentials.payment_secret, raw, timestamp=int(time.time()))
        return await self.request(
            "POST", "/api/v1/payments/callback", raw=raw, headers={SIGNATURE_HEADER: signature}
        )

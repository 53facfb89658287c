"""The admission limit: at most N purchases in flight per process; the rest are shed at once with
503 ``overloaded`` and ``Retry-After: 1``, and only the purchase route is limited."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from benchmarks.baselines import AdmissionLimit
from seckill.api.admission import Admission
from seckill.security.tickets import TICKET_HEADER
from seckill.store.ledger import Ledger
from tests.api.conftest import api_settings, running_api
from tests.conftest import RedisTarget, redis_settings


class HeldApp:
    """An ASGI app that answers 200 only when the test releases it (or raises, if told to)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.entered = 0
        self.fail = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.entered += 1
        await self.release.wait()
        if self.fail:
            raise RuntimeError("the app failed")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


async def call(app: ASGIApp, method: str, path: str) -> list[Message]:
    """One request straight to an ASGI app: the messages it sent back."""
    scope: dict[str, Any] = {"type": "http", "method": method, "path": path, "headers": []}
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


def status(sent: list[Message]) -> int:
    return int(sent[0]["status"])


async def test_the_limit_sheds_the_excess_and_frees_slots_when_answers_are_sent() -> None:
    inner = HeldApp()
    limit = AdmissionLimit(inner, max_in_flight=2)
    held = [asyncio.create_task(call(limit, "POST", f"/api/v1/items/{n}/orders")) for n in (1, 2)]
    await asyncio.sleep(0)
    assert (inner.entered, limit.admission.in_flight) == (2, 2)

    # Answered at once, without waiting for a slot (a broken limit would hang: fail instead).
    shed = await asyncio.wait_for(call(limit, "POST", "/api/v1/items/3/orders"), 5)
    assert status(shed) == 503
    headers = dict(shed[0]["headers"])
    assert headers[b"retry-after"] == b"1"
    assert headers[b"content-type"] == b"application/json"
    body = json.loads(shed[1]["body"])
    assert body["error"] == "overloaded" and body["message"]
    assert inner.entered == 2  # the shed request never reached the app

    # Other routes are not limited, even while purchases fill every slot.
    others = [
        asyncio.create_task(call(limit, method, path))
        for method, path in [
            ("POST", "/api/v1/items/1/tickets"),
            ("GET", "/api/v1/items/1"),
            ("GET", "/api/v1/items/1/orders"),
            ("POST", "/api/v1/items/1/orders/extra"),
        ]
    ]
    await asyncio.sleep(0)
    assert inner.entered == 6

    inner.release.set()
    assert [status(s) for s in await asyncio.gather(*held, *others)] == [200] * 6
    assert limit.admission.in_flight == 0
    assert status(await call(limit, "POST", "/api/v1/items/3/orders")) == 200


async def test_a_failing_request_gives_its_slot_back() -> None:
    inner = HeldApp()
    inner.fail = True
    inner.release.set()
    limit = AdmissionLimit(inner, max_in_flight=1)
    with pytest.raises(RuntimeError):
        await call(limit, "POST", "/api/v1/items/1/orders")
    assert limit.admission.in_flight == 0
    inner.fail = False
    assert status(await call(limit, "POST", "/api/v1/items/1/orders")) == 200


def test_the_counter() -> None:
    admission = Admission(2)
    assert admission.try_enter() and admission.try_enter()
    assert not admission.try_enter()
    admission.leave()
    assert admission.try_enter()
    with pytest.raises(ValueError, match="at least 1"):
        Admission(0)


@pytest.mark.redis_variants("redis7")
@pytest.mark.parametrize("sql_url", ["sqlite"], indirect=True)
async def test_a_crowd_over_the_limit_gets_some_503s_and_stock_stays_consistent(
    redis_server: RedisTarget, redis: Redis, ledger: Ledger, sql_url: str, tmp_path: Path
) -> None:
    settings = api_settings(
        **redis_settings(redis_server),
        database_url=sql_url,
        data_dir=tmp_path,
        admission_max_in_flight=1,
    )
    async with running_api(settings) as api:
        item_id = await api.create_item(total=20)
        buyers = [f"buyer-{n}" for n in range(100)]
        tickets = await asyncio.gather(*(api.ticket(item_id, b) for b in buyers))

        async def attempt(buyer: str, ticket: str) -> Any:
            return await api.http.post(
                f"/api/v1/items/{item_id}/orders",
                headers={**api.as_buyer(buyer), "Idempotency-Key": "k", TICKET_HEADER: ticket},
                json={"quantity": 1},
            )

        answers = await asyncio.gather(*map(attempt, buyers, tickets))
        statuses = Counter(a.status_code for a in answers)
        assert statuses[503] > 0, statuses
        assert statuses.keys() <= {202, 409, 503}, statuses
        for answer in answers:
            if answer.status_code == 503:
                assert answer.json()["error"] == "overloaded"
                assert answer.headers["Retry-After"] == "1"
            elif answer.status_code == 409:
                assert answer.json()["error"] == "sold_out"
        stock = await api.runtime.engine.stock(item_id)
        assert stock is not None and stock.balanced
        assert stock.held == statuses[202]
        units = await api.runtime.engine.buyer_units(item_id)
        assert set(units) == {
            b for b, a in zip(buyers, answers, strict=True) if a.status_code == 202
        }
        # Once the crowd is gone, the one slot is free again.
        assert (await api.buy(item_id, "late-buyer", "k")).status_code in {202, 409}

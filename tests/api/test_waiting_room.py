"""The waiting room over HTTP: join, poll with the pass, be let in by the inlet, take a ticket,
buy; passes bound to their buyer and item; the truth once the item is sold out."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from seckill.bootstrap.keys import ticket_secret
from seckill.domain.queue import QueueState
from seckill.security.passes import PASS_HEADER, PassCodec, QueuePass
from seckill.store.ledger import Ledger
from tests.api.conftest import Answer, Api, waiting_room_api
from tests.conftest import RedisTarget
from tests.support.polling import wait_until

pytestmark = [
    pytest.mark.redis_variants("redis7", "cluster"),
    pytest.mark.parametrize("sql_url", ["sqlite"], indirect=True),
]


@pytest.fixture
async def queued(
    redis_server: RedisTarget, redis: Redis, ledger: Ledger, sql_url: str, tmp_path: Path
) -> AsyncIterator[Api]:
    """The API with a waiting room and its inlet (5 a second, 1 per unit in a turn)."""
    pace = {"queue_admit_per_second": 5, "queue_admit_per_unit": 1}
    async with waiting_room_api(redis_server, sql_url, tmp_path, **pace) as live:
        yield live


async def join(api: Api, item_id: int, buyer: str) -> Answer:
    return await api.http.post(f"/api/v1/items/{item_id}/queue", headers=api.as_buyer(buyer))


async def poll(api: Api, item_id: int, buyer: str, queue_pass: str) -> Answer:
    headers = {**api.as_buyer(buyer), PASS_HEADER: queue_pass}
    return await api.http.get(f"/api/v1/items/{item_id}/queue", headers=headers)


async def standing_of(api: Api, item_id: int, buyer: str, queue_pass: str) -> dict[str, Any]:
    answer = await poll(api, item_id, buyer, queue_pass)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


async def test_a_buyer_waits_is_let_in_and_buys(queued: Api) -> None:
    item_id = await queued.create_item(total=3)
    joined = [await join(queued, item_id, f"b{i}") for i in range(6)]
    assert all(a.status_code == 200 for a in joined), joined[0].text
    bodies = [a.json() for a in joined]
    assert [b["position"] for b in bodies] == [1, 2, 3, 4, 5, 6]
    assert set(bodies[0]) == {
        "pass", "position", "ahead", "admitted_up_to", "estimated_wait_s", "state"
    }  # fmt: skip
    again = await join(queued, item_id, "b5")
    assert again.json()["position"] == 6  # joining twice answers the same place

    # Too early for b5: the gate refuses a ticket, politely.
    refused = await queued.issue_ticket(item_id, "b5")
    assert refused.status_code == 429 and refused.json()["error"] == "gate_refused"
    assert int(refused.headers["Retry-After"]) >= 1

    async def admitted(buyer: str, queue_pass: str) -> bool:
        body = await standing_of(queued, item_id, buyer, queue_pass)
        return body["state"] == QueueState.ADMITTED

    await wait_until(lambda: admitted("b0", bodies[0]["pass"]), 10, "the buyer let in")
    seen = await poll(queued, item_id, "b0", bodies[0]["pass"])
    assert seen.headers["Cache-Control"] == "private, max-age=1"
    assert seen.json()["ahead"] == 0
    bought = await queued.buy(item_id, "b0", "key-b0")
    assert bought.status_code == 202, bought.text
    # 1 per unit within a turn: 3 units, so the stock lets 3 in and no more.
    await wait_until(lambda: admitted("b2", bodies[2]["pass"]), 10, "the buyer let in")
    await asyncio.sleep(0.5)
    late = await standing_of(queued, item_id, "b3", bodies[3]["pass"])
    assert late["state"] == QueueState.WAITING and late["position"] == 4
    assert late["admitted_up_to"] == 3 and late["ahead"] == 0

    report = await queued.http.get(f"/api/v1/admin/items/{item_id}/queue", headers=queued.as_admin)
    assert report.status_code == 200, report.text
    body = report.json()
    assert body["length"] == 6 and body["admitted_up_to"] == 3 and body["drawn"]
    steps = [step["upto"] for step in body["admissions"]]
    assert steps == sorted(steps) and steps[-1] == 3
    dashboard = await queued.http.get(
        f"/api/v1/admin/dashboard?item={item_id}", headers=queued.as_admin
    )
    assert dashboard.json()["items"][0]["queue"] == {"joined": 6, "admitted_up_to": 3, "waiting": 3}
    stranger = await queued.http.get(
        f"/api/v1/admin/items/{item_id}/queue", headers=queued.as_buyer("b0")
    )
    assert stranger.status_code == 403


async def test_a_buyer_never_queued_gets_no_ticket(queued: Api) -> None:
    item_id = await queued.create_item(total=3)
    refused = await queued.issue_ticket(item_id, "stranger")
    assert refused.status_code == 429
    assert "join the waiting room first" in refused.json()["message"]


async def test_passes_are_bound_to_their_buyer_and_item(queued: Api) -> None:
    item_id = await queued.create_item(total=3)
    other_item = await queued.create_item(total=3)
    alice = (await join(queued, item_id, "alice")).json()["pass"]
    assert (await poll(queued, item_id, "alice", alice)).status_code == 200
    codec = PassCodec(ticket_secret(queued.settings))
    forged = PassCodec("another-secret-" + "z" * 32).mint(
        QueuePass(item_id=item_id, buyer="alice", position=1, expires_at_ms=2**40)
    )
    expired = codec.mint(QueuePass(item_id=item_id, buyer="alice", position=1, expires_at_ms=1))
    for buyer, item, text, reason in [
        ("mallory", item_id, alice, "another buyer"),
        ("alice", other_item, alice, "another item"),
        ("alice", item_id, forged, "signature"),
        ("alice", item_id, expired, "expired"),
        ("alice", item_id, alice[:-1] + ("1" if alice.endswith("0") else "0"), "signature"),
    ]:
        answer = await poll(queued, item, buyer, text)
        assert answer.status_code == 403, (reason, answer.text)
        assert answer.json()["error"] == "invalid_pass"
        assert reason in answer.json()["message"]
    missing = await queued.http.get(
        f"/api/v1/items/{item_id}/queue", headers=queued.as_buyer("alice")
    )
    assert missing.status_code == 403
    anonymous = await queued.http.get(
        f"/api/v1/items/{item_id}/queue", headers={PASS_HEADER: alice}
    )
    assert anonymous.status_code == 401


async def test_joining_is_refused_outside_the_window(queued: Api) -> None:
    early = await queued.create_item(
        total=3, starts_in=timedelta(hours=1), ends_in=timedelta(hours=2)
    )
    refused = await join(queued, early, "alice")
    assert refused.status_code == 403 and refused.json()["error"] == "not_started"
    assert (await join(queued, 999_999, "alice")).status_code == 404


async def test_a_pre_start_joiner_learns_the_drawn_position_after_the_start(
    queued: Api,
) -> None:
    item_id = await queued.create_item(
        total=3, starts_in=timedelta(seconds=2), ends_in=timedelta(hours=1)
    )
    before = (await join(queued, item_id, "early")).json()
    assert before["position"] is None and before["state"] == QueueState.WAITING
    assert 0 <= before["estimated_wait_s"] <= 3  # until the draw

    async def drawn() -> bool:
        body = await standing_of(queued, item_id, "early", before["pass"])
        return body["position"] == 1

    await wait_until(drawn, 10, "the draw")
    after = await standing_of(queued, item_id, "early", before["pass"])
    assert after["pass"] != before["pass"]  # the new pass carries the position
    assert (await standing_of(queued, item_id, "early", after["pass"]))["position"] == 1


async def test_sold_out_reaches_every_waiting_pass(queued: Api) -> None:
    item_id = await queued.create_item(total=1)
    passes = {f"b{i}": (await join(queued, item_id, f"b{i}")).json()["pass"] for i in range(5)}

    async def admitted() -> bool:
        body = await standing_of(queued, item_id, "b0", passes["b0"])
        return body["state"] == QueueState.ADMITTED

    await wait_until(admitted, 10, "the buyer let in")
    bought = await queued.buy(item_id, "b0", "key")
    assert bought.status_code == 202
    paid = await queued.pay(item_id, bought.json()["order_id"], "pay-1")
    assert paid.status_code == 200, paid.text

    async def all_sold_out() -> bool:
        states = [
            (await standing_of(queued, item_id, buyer, text))["state"]
            for buyer, text in passes.items()
        ]
        return set(states) == {QueueState.SOLD_OUT}

    await wait_until(all_sold_out, 5, "every pass reading sold_out")


async def test_without_a_waiting_room_the_queue_routes_say_so(api: Api) -> None:
    item_id = await api.create_item(total=1)
    answer = await join(api, item_id, "alice")
    assert answer.status_code == 404 and answer.json()["error"] == "no_waiting_room"


async def test_an_item_without_a_room_sells_directly_while_anothers_is_open(queued: Api) -> None:
    roomed = await queued.create_item(total=3)  # the deployment's default: a room
    plain = await queued.create_item(total=3, waiting_room=False)
    assert (await join(queued, roomed, "alice")).status_code == 200
    refused = await queued.issue_ticket(roomed, "bob")
    assert refused.status_code == 429 and "join the waiting room first" in refused.text

    bought = await queued.buy(plain, "bob", "key-bob")  # no queue: a ticket at once
    assert bought.status_code == 202, bought.text
    no_room = await join(queued, plain, "carol")
    assert no_room.status_code == 404 and no_room.json()["error"] == "no_waiting_room"

    cards = [(await queued.http.get(f"/api/v1/items/{i}")).json() for i in (roomed, plain)]
    assert [c["waiting_room"] for c in cards] == [True, False]
    assert cards[0]["queue_admit_per_second"] is None  # the deployment's
    listed = await queued.http.get("/api/v1/admin/items", headers=queued.as_admin)
    rows = listed.json()["items"]
    assert {row["item_id"]: row["waiting_room"] for row in rows} == {roomed: True, plain: False}


async def test_an_item_has_its_own_pace_and_opening(queued: Api) -> None:
    early = await queued.create_item(total=3, starts_in=timedelta(minutes=5), queue_open_seconds=60)
    refused = await join(queued, early, "alice")  # the deployment's lead (600 s) would admit
    assert refused.status_code == 403 and refused.json()["error"] == "not_started", refused.text
    assert "opens in 24" in refused.json()["message"]

    paced = await queued.create_item(total=50, queue_admit_per_second=40)
    card = (await queued.http.get(f"/api/v1/items/{paced}")).json()
    assert (card["queue_admit_per_second"], card["queue_open_seconds"]) == (40, None)
    for i in range(30):
        assert (await join(queued, paced, f"b{i}")).status_code == 200

    async def all_in() -> bool:
        report = await queued.http.get(
            f"/api/v1/admin/items/{paced}/queue", headers=queued.as_admin
        )
        return int(report.json()["admitted_up_to"]) == 30

    # At the deployment's 5 a second the last of 30 would wait 5 s; at its own 40, one step.
    await wait_until(all_in, 2.5, "all 30 let in at 40 a second")

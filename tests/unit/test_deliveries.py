"""The "order events delivered" verdict (no broker): what a consumer got of one sale, judged
against the crowd's orders and SQL's journal; copies by id are fine, anything else fails."""

from __future__ import annotations

from seckill.crowd.deliveries import (
    Delivery,
    Feed,
    journaled_ids,
    judge_deliveries,
    ours,
)
from seckill.domain.events import EventKind, ReleaseReason, StockEvent
from seckill.engine.keys import DEFAULT_PREFIX, item_keys
from seckill.sinks.messages import OrderEventBody, order_message
from seckill.store.records import JournalRow

ITEM = 7
START_MS = 1_714_564_800_000
ORDERS = {"101": "paid", "102": "released", "103": "refund_required"}


def delivery(
    order_id: str, kind: EventKind, entry: int, *, item: int = ITEM, at_ms: int = START_MS
) -> Delivery:
    event = StockEvent(
        event_id=f"{START_MS + entry}-0", kind=kind, item_id=item, at_ms=at_ms + entry,
        order_id=int(order_id), buyer=f"buyer-{order_id}", quantity=1,
        deadline_ms=at_ms + 2000 if kind is EventKind.RESERVED else None,
        reason=ReleaseReason.EXPIRED if kind is not EventKind.RESERVED and kind is not
        EventKind.PAID else None,
    )  # fmt: skip
    message = order_message(event, stream=item_keys(item, DEFAULT_PREFIX).events)
    assert message is not None
    return Delivery(message.message_id, OrderEventBody.model_validate_json(message.body))


def the_sale() -> list[Delivery]:
    """Three orders' events as the bridge publishes them: each order's in stream order."""
    return [
        delivery("101", EventKind.RESERVED, 1),
        delivery("102", EventKind.RESERVED, 2),
        delivery("103", EventKind.RESERVED, 3),
        delivery("101", EventKind.PAID, 4),
        delivery("102", EventKind.RELEASED, 5),
        delivery("103", EventKind.RELEASED, 6),
        delivery("103", EventKind.REFUND_REQUIRED, 7),
    ]


def journal(deliveries: list[Delivery]) -> list[JournalRow]:
    return [
        JournalRow(d.body.entry_id, EventKind(d.body.event), int(d.body.order_id), 1)
        for d in deliveries
    ]


def test_every_event_once_in_order_passes_and_copies_by_id_are_counted() -> None:
    sale = the_sale()
    check = judge_deliveries(
        orders=ORDERS, deliveries=[*sale, sale[3], sale[0]],
        journaled=journaled_ids(ITEM, journal(sale), prefix=DEFAULT_PREFIX), skipped=4,
    )  # fmt: skip

    assert check.ok, check.detail
    assert check.name == "order events delivered"
    assert "7 events of 3 orders delivered (2 copies dropped by message id, 4 other" in check.detail


def test_a_missing_last_event_or_journaled_event_fails() -> None:
    sale = the_sale()
    without_paid = [d for d in sale if d is not sale[3]]
    check = judge_deliveries(orders=ORDERS, deliveries=without_paid)
    assert not check.ok and "1 missing: paid of order 101" in check.detail

    # The crowd was told refund_required; the release before it is owed by SQL's journal.
    without_release = [d for d in sale if d is not sale[5]]
    check = judge_deliveries(
        orders=ORDERS,
        deliveries=without_release,
        journaled=journaled_ids(ITEM, journal(sale), prefix=DEFAULT_PREFIX),
    )
    assert not check.ok and f"journaled {sale[5].message_id}" in check.detail


def test_an_order_with_no_event_at_all_fails() -> None:
    check = judge_deliveries(orders={**ORDERS, "104": "released"}, deliveries=the_sale())
    assert not check.ok
    assert "2 missing" in check.detail and "reserved of order 104" in check.detail


def test_one_event_under_two_ids_fails() -> None:
    sale = the_sale()
    again = delivery("101", EventKind.PAID, 8)  # the same change under a new entry
    check = judge_deliveries(orders=ORDERS, deliveries=[*sale, again])
    assert not check.ok and "1 delivered twice: paid of order 101 under 2 ids" in check.detail


def test_events_out_of_their_order_fail() -> None:
    sale = the_sale()
    swapped = [sale[3], *(d for d in sale if d is not sale[3])]  # paid before reserved
    check = judge_deliveries(orders=ORDERS, deliveries=swapped)
    assert not check.ok and "order 101 got paid, reserved" in check.detail

    refund_first = [d for d in sale if d is not sale[5]] + [sale[5]]
    check = judge_deliveries(orders=ORDERS, deliveries=refund_first)
    assert not check.ok
    assert "order 103 got reserved, refund_required, released" in check.detail


def test_an_order_the_crowd_does_not_know_fails() -> None:
    stranger = [delivery("999", EventKind.RESERVED, 9), delivery("999", EventKind.PAID, 10)]
    check = judge_deliveries(orders=ORDERS, deliveries=[*the_sale(), *stranger])
    assert not check.ok and "1 of orders the crowd does not know: 999" in check.detail


def test_only_this_sales_messages_count() -> None:
    mine = delivery("101", EventKind.RESERVED, 1)
    assert ours(mine, item_id=ITEM, since_ms=START_MS, prefix=DEFAULT_PREFIX)
    other_item = delivery("101", EventKind.RESERVED, 1, item=ITEM + 1)
    assert not ours(other_item, item_id=ITEM, since_ms=START_MS, prefix=DEFAULT_PREFIX)
    earlier_sale = delivery("101", EventKind.RESERVED, 1, at_ms=START_MS - 60_000)
    assert not ours(earlier_sale, item_id=ITEM, since_ms=START_MS, prefix=DEFAULT_PREFIX)
    other_prefix = Delivery(mine.message_id.replace("seckill:", "shop:", 1), mine.body)
    assert not ours(other_prefix, item_id=ITEM, since_ms=START_MS, prefix=DEFAULT_PREFIX)


def test_the_feed_keeps_order_events_of_the_window_and_counts_the_rest() -> None:
    feed = Feed(START_MS)
    mine = delivery("101", EventKind.RESERVED, 1)
    feed.take(mine.message_id, mine.body.model_dump_json().encode())
    old = delivery("101", EventKind.RESERVED, 1, at_ms=START_MS - 60_000)
    feed.take(old.message_id, old.body.model_dump_json().encode())
    feed.take("x/1-0", b"not json")
    feed.take(None, mine.body.model_dump_json().encode())

    assert feed.received == [mine]
    assert feed.skipped == 3

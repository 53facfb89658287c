"""The verdict on the bridge: every order event of the sale reached a broker's consumer.

A plain consumer of the broker's default topology (RabbitMQ's quorum queue ``seckill.orders``;
an ephemeral pull consumer on NATS's stream ``SECKILL_ORDERS``, new messages only) is attached
before the item exists and reads until the audit. The topology is shared: messages of other
items, of earlier sales (a throwaway server numbers its items from 1 again), of other
deployments (another key prefix: the demo gives each bridged run its own) and anything that is
not an order event are skipped, by the body's item, its stream, its message id and its time.
What RabbitMQ's queue holds is consumed: every message read is acknowledged.

The verdict (:func:`judge_deliveries`), once the events SQL journaled have all arrived or a bound
has passed: each order the crowd was answered 202 for has its ``reserved`` and its last event
(paid, released, refund_required) delivered, as has every order event in SQL's journal; after
dropping copies by message id, no event of an order came twice (under two ids); in each order
the events are in their stream's order in the broker's (NATS: the stream's sequence; RabbitMQ:
the order of arrival), ``reserved`` first; and no event names an order the crowd does not know.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pydantic import ValidationError

from seckill.domain.events import EventKind
from seckill.domain.orders import OrderStatus
from seckill.engine.audit import Check
from seckill.engine.keys import item_keys
from seckill.sinks import OrderEventBody, sink_from_url
from seckill.sinks.messages import forwarded, message_id
from seckill.store.records import JournalRow

if TYPE_CHECKING:
    from aio_pika.abc import AbstractIncomingMessage

log = logging.getLogger(__name__)

NAME = "order events delivered"
DELIVERY_LIMIT_S = 30.0  # the backlog drains in well under a second at a demo's size
QUIET_S = 0.5  # after the last expected message: long enough for a stray copy to show up
PREFETCH = 500
# A pull's wait: the crowd shares the event loop, and a pull whose wait ran out before it was
# even sent ends at once.
PULL_WAIT_S = 2.0
_SHOWN = 3  # examples named in a detail

# The event an order's last status was made by.
LAST_EVENT: Mapping[str, EventKind] = {
    OrderStatus.PAID: EventKind.PAID,
    OrderStatus.RELEASED: EventKind.RELEASED,
    OrderStatus.REFUND_REQUIRED: EventKind.REFUND_REQUIRED,
}


@dataclass(frozen=True, slots=True)
class Delivery:
    """One message as the consumer received it. ``position``: its place in the broker's order
    (NATS: the stream's sequence, so a message delivered again takes its own place; RabbitMQ:
    the order of arrival)."""

    message_id: str
    body: OrderEventBody
    position: int = 0


def ours(delivery: Delivery, *, item_id: int, since_ms: int, prefix: str) -> bool:
    """The message is an event of this sale: the item's, from one of the item's streams (with
    the id that stream entry gives), and no older than the sale's start."""
    body = delivery.body
    stream = item_keys(item_id, prefix, body.shard).events
    return (
        body.item_id == item_id
        and body.at_ms >= since_ms
        and body.stream == stream
        and delivery.message_id == message_id(stream, body.entry_id)
    )


def journaled_ids(item_id: int, journal: Iterable[JournalRow], *, prefix: str) -> set[str]:
    """The message ids of the order events SQL journaled for the item: what the bridge owes."""
    return {
        message_id(item_keys(item_id, prefix, row.shard).events, row.event_id)
        for row in journal
        if forwarded(row.event, row.reason)
    }


def _owed(orders: Mapping[str, str]) -> set[tuple[str, str]]:
    """(order id, event) of every order's ``reserved`` and last event."""
    owed = {(order_id, str(EventKind.RESERVED)) for order_id in orders}
    owed |= {(o, str(LAST_EVENT[s])) for o, s in orders.items() if s in LAST_EVENT}
    return owed


async def delivered(
    feed: Feed,
    *,
    item_id: int,
    orders: Mapping[str, str],
    journal: Iterable[JournalRow] | None,
    prefix: str,
) -> Check:
    """Wait for the sale's events to arrive (every one SQL journaled, and each order's
    ``reserved`` and last event), up to a bound, then judge what did."""
    journaled = journaled_ids(item_id, journal, prefix=prefix) if journal is not None else set()
    owed = _owed(orders)

    def sale(received: Iterable[Delivery]) -> list[Delivery]:
        return [
            d for d in received if ours(d, item_id=item_id, since_ms=feed.since_ms, prefix=prefix)
        ]

    def done(received: Sequence[Delivery]) -> bool:
        got = sale(received)
        return journaled <= {d.message_id for d in got} and owed <= {
            (d.body.order_id, str(d.body.event)) for d in got
        }

    await feed.until(done)
    deliveries = sorted(sale(feed.received), key=lambda d: d.position)
    skipped = feed.skipped + len(feed.received) - len(deliveries)
    return judge_deliveries(
        orders=orders, deliveries=deliveries, journaled=journaled, skipped=skipped
    )


def _entry_order(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def judge_deliveries(
    *,
    orders: Mapping[str, str],
    deliveries: Sequence[Delivery],
    journaled: Iterable[str] = (),
    skipped: int = 0,
) -> Check:
    """The verdict on what a consumer received of one sale (``deliveries``, already only the
    sale's, in the broker's order). ``orders``: order id -> the status the crowd was last
    told; ``journaled``: the message ids SQL's journal owes; ``skipped``: other messages read."""
    first: dict[str, Delivery] = {}
    for delivery in deliveries:
        first.setdefault(delivery.message_id, delivery)
    copies = len(deliveries) - len(first)
    ids_of: dict[tuple[str, str], set[str]] = defaultdict(set)  # (order, event) -> ids
    arrived: dict[str, list[OrderEventBody]] = defaultdict(list)  # order -> events, as arrived
    for delivery in first.values():
        body = delivery.body
        ids_of[body.order_id, str(body.event)].add(delivery.message_id)
        arrived[body.order_id].append(body)

    missing = sorted(
        f"{kind} of order {order_id}" for order_id, kind in _owed(orders) - ids_of.keys()
    )
    missing += sorted(f"journaled {mid}" for mid in set(journaled) - first.keys())
    twice = [
        f"{kind} of order {order_id} under {len(ids)} ids"
        for (order_id, kind), ids in ids_of.items()
        if len(ids) > 1
    ]
    strangers = sorted(order_id for order_id in arrived if order_id not in orders)
    out_of_order = []
    for order_id, bodies in arrived.items():
        in_stream = sorted(bodies, key=lambda b: (b.shard, _entry_order(b.entry_id)))
        if bodies != in_stream or bodies[0].event != EventKind.RESERVED:
            shown = ", ".join(b.event for b in bodies)
            out_of_order.append(f"order {order_id} got {shown}")

    events = len(first)
    detail = (
        f"{events:,} events of {len(arrived):,} orders delivered ({copies} copies dropped by "
        f"message id, {skipped:,} other messages skipped); the crowd holds {len(orders):,} orders"
    )
    problems = [
        (f"{len(missing)} missing", missing),
        (f"{len(twice)} delivered twice", twice),
        (f"{len(out_of_order)} out of order", out_of_order),
        (f"{len(strangers)} of orders the crowd does not know", strangers),
    ]
    failed = [f"{what}: {', '.join(examples[:_SHOWN])}" for what, examples in problems if examples]
    if failed:
        return Check(NAME, False, f"{detail}; " + "; ".join(failed))
    return Check(NAME, True, f"{detail}; each order's events in order, reserved first")


# -- the consumers --------------------------------------------------------------------------------


@dataclass(slots=True)
class Feed:
    """What a consumer has received so far: the messages no older than ``since_ms``, in the
    order they arrived; every other message is only counted."""

    since_ms: int
    received: list[Delivery] = field(default_factory=list)
    skipped: int = 0
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def take(self, mid: str | None, body: bytes, *, position: int | None = None) -> None:
        """Keep one message; ``position`` as in :class:`Delivery` (default: its arrival)."""
        try:
            parsed = OrderEventBody.model_validate_json(body)
        except ValidationError:
            parsed = None
        if parsed is None or mid is None or parsed.at_ms < self.since_ms:
            self.skipped += 1
            return
        place = len(self.received) + self.skipped if position is None else position
        self.received.append(Delivery(mid, parsed, place))
        self._arrived.set()

    async def until(
        self, done: Callable[[Sequence[Delivery]], bool], *, limit_s: float = DELIVERY_LIMIT_S
    ) -> None:
        """Wait until ``done`` holds of what arrived, or ``limit_s``; then a quiet moment."""
        give_up = time.monotonic() + limit_s
        while time.monotonic() < give_up:
            if done(self.received):
                break
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), timeout=0.2)
        await asyncio.sleep(QUIET_S)


@contextlib.asynccontextmanager
async def following(url: str, *, since_ms: int) -> AsyncIterator[Feed]:
    """A consumer of the broker at ``url`` (its default topology, made as the bridge makes it
    when missing) attached until exit; yields what it has received."""
    sink = sink_from_url(url)
    await sink.open()  # the bridge's own declaration: the exchange and queue, or the stream
    await sink.close()
    feed = Feed(since_ms)
    consumer = _rabbitmq if sink.name == "rabbitmq" else _nats
    async with consumer(url, feed):
        yield feed


@contextlib.asynccontextmanager
async def _rabbitmq(url: str, feed: Feed) -> AsyncIterator[None]:
    # Imported here: following one broker does not load the other's client.
    import aio_pika

    from seckill.sinks.rabbitmq import DEFAULT_QUEUE

    connection = await aio_pika.connect(url, timeout=5)
    try:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=PREFETCH)
        queue = await channel.declare_queue(
            DEFAULT_QUEUE, durable=True, arguments={"x-queue-type": "quorum"}
        )

        async def on_message(message: AbstractIncomingMessage) -> None:
            feed.take(message.message_id, message.body)
            await message.ack()

        tag = await queue.consume(on_message)
        try:
            yield
        finally:
            await queue.cancel(tag)
    finally:
        await connection.close()


@contextlib.asynccontextmanager
async def _nats(url: str, feed: Feed) -> AsyncIterator[None]:
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, Header

    from seckill.sinks.nats import DEFAULT_STREAM, DEFAULT_SUBJECT_PREFIX

    client = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=1)
    try:
        reader = await client.jetstream().pull_subscribe(
            f"{DEFAULT_SUBJECT_PREFIX}.>",
            stream=DEFAULT_STREAM,
            config=ConsumerConfig(
                deliver_policy=DeliverPolicy.NEW,
                ack_policy=AckPolicy.EXPLICIT,
                # A message delivered but never taken (a pull that timed out as it arrived) comes
                # again soon, well within the verdict's wait; its copy is dropped by message id.
                ack_wait=2.0,
                inactive_threshold=30.0,  # the server drops it once nobody pulls
            ),
        )

        async def pull() -> None:
            while True:
                try:
                    batch = await reader.fetch(PREFETCH, timeout=PULL_WAIT_S)
                    for message in batch:
                        headers = message.headers or {}
                        feed.take(
                            headers.get(Header.MSG_ID.value),
                            message.data,
                            position=message.metadata.sequence.stream,
                        )
                        await message.ack()
                except TimeoutError:  # nothing new; nats-py's own is one too
                    continue
                except nats.errors.Error as exc:  # the verdict names what never arrived
                    log.warning("nats consumer: %r; pulling again", exc)
                    await asyncio.sleep(PULL_WAIT_S)

        puller = asyncio.create_task(pull())
        try:
            yield
        finally:
            puller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await puller
            with contextlib.suppress(nats.errors.Error):
                await reader.unsubscribe()
    finally:
        await client.close()

"""One behaviour suite for every sink, run against the machine's real brokers.

Each test runs on RabbitMQ (``SECKILL_TEST_AMQP_URL``) and on NATS JetStream
(``SECKILL_TEST_NATS_URL``), through a :class:`Broker`: the test's own exchange and queue, or
stream and subjects (a random suffix: tests run in parallel), read back by a plain consumer of
that broker and deleted at the end. A broker that cannot be reached fails the suite.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from urllib.parse import urlsplit

import jsonschema_rs
import pytest

from benchmarks.tcp_proxy import TcpProxy
from seckill.domain.events import EventKind, decode_event
from seckill.engine.keys import DEFAULT_PREFIX, item_keys
from seckill.sinks import (
    Message,
    OrderEventBody,
    Sink,
    SinkRefused,
    SinkUnavailable,
    body_schema,
    order_message,
    sink_from_url,
)
from seckill.sinks.nats import NatsSink
from seckill.sinks.rabbitmq import RabbitMQSink
from tests.support.brokers import FAST, Broker, elsewhere, free_port, sink_of

# -- the messages ---------------------------------------------------------------------------------


def sale_messages(orders: int, *, first_ms: int = 1_714_564_800_000) -> list[Message]:
    """Two events per order: reserved, then paid, released or refund_required in turn. The
    orders are spread over four items, one of them with its events on a stock shard's stream."""
    messages: list[Message] = []
    for n in range(orders):
        item_id, shard = (7, 2) if n % 4 == 3 else (40 + n % 4, 0)
        stream = item_keys(item_id, DEFAULT_PREFIX, shard=shard).events
        order = {"item_id": str(item_id), "order_id": str(10**17 + n), "buyer": f"buyer-{n}"}
        at = first_ms + n
        end: dict[str, str] = [
            {"event": "paid"},
            {"event": "released", "reason": "expired"},
            {"event": "refund_required", "reason": "payment_failed"},
        ][n % 3]
        entries = [
            {"event": "reserved", "deadline_ms": str(at + 60_000), "request_id": f"req-{n}"},
            end,
        ]
        for seq, extra in enumerate(entries):
            fields = {**order, "quantity": str(1 + n % 2), "at_ms": str(at + seq), **extra}
            event = decode_event(f"{at}-{seq}", fields, shard=shard)
            message = order_message(event, stream=stream)
            assert message is not None
            messages.append(message)
    return messages


# -- the contract ---------------------------------------------------------------------------------


async def test_a_batch_is_confirmed_and_each_message_received_once(
    broker: Broker, sinks: list[Sink]
) -> None:
    messages = sale_messages(250)  # 500 events of the four kinds, five streams
    assert {m.kind for m in messages} == {
        EventKind.RESERVED,
        EventKind.PAID,
        EventKind.RELEASED,
        EventKind.REFUND_REQUIRED,
    }
    sink = sink_of(broker, sinks)
    assert sink.name == broker.name

    async with asyncio.timeout(20):
        await sink.publish(messages)
    got = await broker.received(len(messages))

    # Each once, none other, in the batch's order: an order's reserved before its paid.
    assert [d.message_id for d in got] == [m.message_id for m in messages]
    by_id = {d.message_id: d for d in got}
    validator = jsonschema_rs.validator_for(body_schema(), validate_formats=True)
    for message in messages:
        delivery = by_id[message.message_id]
        assert delivery.routing_key == message.routing_key == f"order.{message.kind.value}"
        assert delivery.kind == message.kind.value
        assert delivery.content_type == "application/json"
        assert delivery.persistent
        assert delivery.body == message.body  # the same bytes on every broker
        validator.validate(json.loads(delivery.body))
        body = OrderEventBody.model_validate_json(delivery.body)
        assert body.event == message.kind
        assert message.message_id == f"{body.stream}/{body.entry_id}"
        if broker.name == "rabbitmq":
            assert delivery.timestamp_s == body.at_ms // 1000


async def test_the_same_message_twice_is_one_after_dedup_by_id(
    broker: Broker, sinks: list[Sink]
) -> None:
    [message, other] = sale_messages(1)
    sink = sink_of(broker, sinks)

    await sink.publish([message, other])
    await sink.publish([message])  # redelivered: a bridge that crashed before its XACK

    got = await broker.received(2 if broker.server_dedups else 3)
    copies = [d for d in got if d.message_id == message.message_id]
    assert len(got) == len(copies) + 1
    # NATS drops the copy itself; a RabbitMQ consumer sees two with one id, and drops one.
    assert len(copies) == (1 if broker.server_dedups else 2)
    assert {d.body for d in copies} == {message.body}


async def test_a_refusal_names_the_refused_and_the_rest_are_stored(
    broker: Broker, sinks: list[Sink]
) -> None:
    messages = sale_messages(3)  # 6 messages
    sink = await broker.limit(capacity=4)
    sinks.append(sink)

    with pytest.raises(SinkRefused) as refusal:
        await sink.publish(messages)

    refused = refusal.value.message_ids
    assert len(refused) == 2 and refused <= {m.message_id for m in messages}
    assert all(refusal.value.refused.values())  # each with the broker's reason
    got = await broker.received(4)
    assert sorted(d.message_id for d in got) == sorted(
        m.message_id for m in messages if m.message_id not in refused
    )


async def test_nothing_listening_is_unavailable_at_once(broker: Broker, sinks: list[Sink]) -> None:
    sink = sink_of(broker, sinks, url=elsewhere(broker.url(), free_port()), **FAST)
    await sink.publish([])  # nothing to send needs no broker

    started = time.monotonic()
    async with asyncio.timeout(5):
        with pytest.raises(SinkUnavailable):
            await sink.open()
        with pytest.raises(SinkUnavailable):
            await sink.publish(sale_messages(1))
    assert time.monotonic() - started < 3
    await sink.close()
    await sink.close()  # twice is fine


async def test_a_server_that_never_answers_is_unavailable_within_the_connect_timeout(
    broker: Broker, sinks: list[Sink]
) -> None:
    silent: list[asyncio.StreamWriter] = []
    server = await asyncio.start_server(lambda _, w: silent.append(w), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        sink = sink_of(broker, sinks, url=elsewhere(broker.url(), port), **FAST)
        started = time.monotonic()
        async with asyncio.timeout(10):
            with pytest.raises(SinkUnavailable):
                await sink.publish(sale_messages(1))
        assert time.monotonic() - started < FAST["connect_timeout_s"] + 2
    finally:
        for writer in silent:
            writer.transport.abort()
        server.close()
        await server.wait_closed()


async def test_a_lost_connection_is_unavailable_and_the_next_publish_reconnects(
    broker: Broker, sinks: list[Sink]
) -> None:
    address = urlsplit(broker.url())
    proxy = TcpProxy(address.hostname or "127.0.0.1", address.port or 0)
    await proxy.start()
    try:
        sink = sink_of(broker, sinks, url=elsewhere(broker.url(), proxy.port), **FAST)
        before, during, after = (sale_messages(5, first_ms=ms) for ms in (1_000, 2_000, 3_000))
        await sink.publish(before)

        proxy.cut()
        async with asyncio.timeout(10):
            with pytest.raises(SinkUnavailable):
                await sink.publish(during)
        proxy.restore()
        async with asyncio.timeout(10):
            await sink.publish(during)  # the batch again, as the caller must
            await sink.publish(after)
    finally:
        await proxy.stop()

    got = await broker.received(30)
    assert {d.message_id for d in got} == {m.message_id for m in before + during + after}


async def test_a_broker_that_stops_confirming_is_unavailable_within_the_confirm_timeout(
    broker: Broker, sinks: list[Sink]
) -> None:
    address = urlsplit(broker.url())
    link = StallingProxy(address.hostname or "127.0.0.1", address.port or 0)
    await link.start()
    try:
        sink = sink_of(broker, sinks, url=elsewhere(broker.url(), link.port), **FAST)
        await sink.open()

        link.stall()  # the connection stays up; nothing comes back
        started = time.monotonic()
        async with asyncio.timeout(10):
            with pytest.raises(SinkUnavailable):
                await sink.publish(sale_messages(5))
        assert (
            time.monotonic() - started < FAST["confirm_timeout_s"] + FAST["connect_timeout_s"] + 1
        )
        link.resume()
        async with asyncio.timeout(10):
            await sink.publish(sale_messages(5))
    finally:
        await link.stop()


async def test_a_deleted_queue_or_stream_fails_the_batch_and_is_declared_again(
    broker: Broker, sinks: list[Sink]
) -> None:
    sink = sink_of(broker, sinks, **FAST)
    await sink.publish(sale_messages(2, first_ms=1_000))
    await broker.delete_topology()
    batch = sale_messages(2, first_ms=2_000)

    # Nowhere to put it: not one message may pass as delivered.
    with pytest.raises(SinkUnavailable):
        await sink.publish(batch)
    await sink.publish(batch)

    got = await broker.received(len(batch))
    assert sorted(d.message_id for d in got) == sorted(m.message_id for m in batch)


# -- choosing a sink by URL -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("amqp://guest:guest@127.0.0.1:5672/", RabbitMQSink),
        ("amqps://user:pw@rabbit.example:5671/shop", RabbitMQSink),
        ("nats://127.0.0.1:4222", NatsSink),
        ("tls://nats.example:4222", NatsSink),
        ("NATS://127.0.0.1:4222", NatsSink),
    ],
)
def test_the_url_scheme_picks_the_adapter(url: str, kind: type[Sink]) -> None:
    sink = sink_from_url(url)
    assert isinstance(sink, kind)
    assert sink.name == {RabbitMQSink: "rabbitmq", NatsSink: "nats"}[kind]


def test_options_reach_the_adapter() -> None:
    rabbit = sink_from_url("amqp://127.0.0.1/", exchange="shop.orders", queue=None)
    assert isinstance(rabbit, RabbitMQSink)
    assert (rabbit.exchange_name, rabbit.queue_name) == ("shop.orders", None)
    stream = sink_from_url("nats://127.0.0.1", stream="SHOP", duplicate_window_s=60)
    assert isinstance(stream, NatsSink)
    assert (stream.stream, stream.duplicate_window_s) == ("SHOP", 60)
    with pytest.raises(TypeError):
        sink_from_url("nats://127.0.0.1", exchange="shop.orders")  # a RabbitMQ option


@pytest.mark.parametrize(
    "url", ["redis://user:secret@127.0.0.1:6379/0", "kafka://127.0.0.1:9092", "127.0.0.1:5672"]
)
def test_an_unknown_scheme_is_refused_clearly(url: str) -> None:
    with pytest.raises(ValueError, match="amqp://, amqps://, nats://, tls://") as refused:
        sink_from_url(url)
    assert "secret" not in str(refused.value)


# -- a link that goes quiet -----------------------------------------------------------------------


class StallingProxy:
    """Forwards to a server until ``stall()``: then the connections stay open and nothing
    passes either way, as behind a dead router. ``resume()`` drops the stalled connections and
    forwards new ones again."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.target_port = host, port
        self.port = 0
        self.stalled = False
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def stall(self) -> None:
        self.stalled = True

    def resume(self) -> None:
        self.stalled = False
        for writer in list(self._writers):
            writer.transport.abort()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        self.resume()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_r, upstream_w = await asyncio.open_connection(self.host, self.target_port)
        self._writers |= {writer, upstream_w}
        pumps = [self._pump(reader, upstream_w), self._pump(upstream_r, writer)]
        tasks = [asyncio.create_task(p) for p in pumps]
        self._tasks.update(tasks)
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        writer.transport.abort()
        upstream_w.transport.abort()
        self._writers -= {writer, upstream_w}

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                if self.stalled:
                    continue  # swallowed: the other side waits forever
                writer.write(data)
                await writer.drain()

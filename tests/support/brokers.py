"""The machine's real brokers as the tests use them: each test's own exchange and queue (RabbitMQ)
or stream and subjects (NATS JetStream), with a random suffix (tests run in parallel), read back
by a plain consumer of that broker and deleted at the end. ``SECKILL_TEST_AMQP_URL`` and
``SECKILL_TEST_NATS_URL`` name them (each broker is tested when its URL is set); the fixtures
(``tests/integration/conftest.py``) fail a test whose broker cannot be reached.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import time
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import nats
import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage
from nats.js.api import DiscardPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

from seckill.sinks import Sink
from seckill.sinks.nats import NatsSink
from seckill.sinks.rabbitmq import RabbitMQSink

# As the SQL servers: each broker's suites run when its URL is set (CI sets both and requires
# them); with neither, they are reported as skipped, never passed.
AMQP_URL = os.environ.get("SECKILL_TEST_AMQP_URL", "")
NATS_URL = os.environ.get("SECKILL_TEST_NATS_URL", "")

# How long a consumer waits for the next message before it gives up on the rest: a bound on
# silence, not on the whole read, which takes longer on a busy machine.
RECEIVE_LIMIT_S = 10.0
QUIET_S = 0.3  # after the last expected message: long enough for a stray copy to show up
FETCH_BATCH = 500  # NATS messages asked for at once, below a consumer's default max_ack_pending
FAST = {"connect_timeout_s": 1.0, "confirm_timeout_s": 1.5}  # faults fail within seconds


# -- the brokers, as a consumer sees them ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Delivery:
    """A message as a consumer received it, in words common to both brokers."""

    message_id: str
    routing_key: str  # RabbitMQ's routing key; the NATS subject after the sink's prefix
    kind: str  # RabbitMQ's ``type``; NATS's ``Seckill-Event`` header
    content_type: str
    body: bytes
    persistent: bool  # delivery mode 2; a stream on file storage
    timestamp_s: int | None  # RabbitMQ's ``timestamp``; NATS carries none


class Broker(Protocol):
    name: str
    server_dedups: bool  # drops a message id it already has (NATS), or leaves it to consumers

    def sink(self, **options: Any) -> Sink:
        """A sink on the test's own names, at ``url`` (default: the broker's)."""
        ...

    def url(self) -> str: ...

    def names(self) -> dict[str, str]:
        """The test's own topology, as options of ``sink_from_url``."""
        ...

    async def received(self, count: int) -> list[Delivery]:
        """Everything a consumer gets: waits for ``count``, then a moment for any more."""
        ...

    async def limit(self, capacity: int) -> Sink:
        """Make the test's topology store ``capacity`` messages and refuse any more; a sink on
        it (which keeps that topology)."""
        ...

    async def delete_topology(self) -> None:
        """Delete where the messages are stored (the queue; the stream), as an operator might."""
        ...

    async def cleanup(self) -> None: ...


class RabbitMQ:
    name = "rabbitmq"
    server_dedups = False

    def __init__(self, connection: AbstractConnection, channel: AbstractChannel) -> None:
        self.connection = connection
        self.channel = channel
        suffix = secrets.token_hex(4)
        self.exchange = f"seckill.test.{suffix}"
        self.queue = f"seckill.test.{suffix}"

    @classmethod
    async def connect(cls) -> RabbitMQ:
        connection = await aio_pika.connect(AMQP_URL, timeout=5)
        return cls(connection, await connection.channel())

    def url(self) -> str:
        return AMQP_URL

    def names(self) -> dict[str, str]:
        return {"exchange": self.exchange, "queue": self.queue}

    def sink(self, **options: Any) -> Sink:
        url = options.pop("url", AMQP_URL)
        return RabbitMQSink(url, exchange=self.exchange, queue=self.queue, **options)

    async def received(self, count: int) -> list[Delivery]:
        queue = await self.channel.get_queue(self.queue, ensure=True)
        # A consumer the broker pushes to: a basic.get per message is a round trip each (the
        # 7,000 messages of a bridge test took 9 s).
        arrived: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()
        tag = await queue.consume(arrived.put, no_ack=True)
        got: list[Delivery] = []
        try:
            while True:
                try:
                    wait = QUIET_S if len(got) >= count else RECEIVE_LIMIT_S
                    message = await asyncio.wait_for(arrived.get(), wait)
                except TimeoutError:
                    return got
                got.append(
                    Delivery(
                        message_id=message.message_id or "",
                        routing_key=message.routing_key or "",
                        kind=message.type or "",
                        content_type=message.content_type or "",
                        body=message.body,
                        persistent=message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT,
                        timestamp_s=(
                            int(message.timestamp.timestamp()) if message.timestamp else None
                        ),
                    )
                )
        finally:
            await queue.cancel(tag)

    async def limit(self, capacity: int) -> Sink:
        exchange = await self.channel.declare_exchange(
            self.exchange, aio_pika.ExchangeType.TOPIC, durable=True
        )
        # A classic queue: a quorum queue's length limit is checked lazily, and lets a few
        # more in while its state catches up.
        arguments = {
            "x-queue-type": "classic",
            "x-max-length": capacity,
            "x-overflow": "reject-publish",  # a full queue nacks
        }
        queue = await self.channel.declare_queue(self.queue, durable=True, arguments=arguments)
        await queue.bind(exchange, "order.#")
        return RabbitMQSink(AMQP_URL, exchange=self.exchange, queue=None, **FAST)

    async def delete_topology(self) -> None:
        await self.channel.queue_delete(self.queue)

    async def cleanup(self) -> None:
        with contextlib.suppress(aio_pika.exceptions.AMQPError):
            channel = await self.connection.channel()
            await channel.queue_delete(self.queue)
            await channel.exchange_delete(self.exchange)
        await self.connection.close()


class Nats:
    name = "nats"
    server_dedups = True

    def __init__(self, client: nats.NATS) -> None:
        self.client = client
        self.jetstream = client.jetstream()
        suffix = secrets.token_hex(4)
        self.stream = f"SECKILL_TEST_{suffix}"
        self.prefix = f"seckill.test.{suffix}"

    @classmethod
    async def connect(cls) -> Nats:
        return cls(await nats.connect(NATS_URL, connect_timeout=5, max_reconnect_attempts=1))

    def url(self) -> str:
        return NATS_URL

    def names(self) -> dict[str, str]:
        return {"stream": self.stream, "subject_prefix": self.prefix}

    def sink(self, **options: Any) -> Sink:
        url = options.pop("url", NATS_URL)
        return NatsSink(url, stream=self.stream, subject_prefix=self.prefix, **options)

    async def received(self, count: int) -> list[Delivery]:
        info = await self.jetstream.stream_info(self.stream)
        persistent = info.config.storage == StorageType.FILE
        reader = await self.jetstream.pull_subscribe(f"{self.prefix}.>", stream=self.stream)
        got: list[Delivery] = []
        deadline = time.monotonic() + RECEIVE_LIMIT_S
        try:
            while time.monotonic() < deadline:
                # At most FETCH_BATCH at a time: the server stops at the consumer's 1,000
                # unacknowledged messages (max_ack_pending), and a fetch for more then waits out
                # its whole timeout (7,000 messages took 6 s).
                wanted = min(max(count - len(got), 1), FETCH_BATCH)
                wait = QUIET_S if len(got) >= count else 1.0
                try:
                    batch = await reader.fetch(wanted, timeout=wait)
                except TimeoutError:  # nats-py raises its own, or asyncio's
                    if len(got) >= count:
                        break
                    continue
                deadline = time.monotonic() + RECEIVE_LIMIT_S
                for message in batch:
                    await message.ack()
                    headers = message.headers or {}
                    got.append(
                        Delivery(
                            message_id=headers.get("Nats-Msg-Id", ""),
                            routing_key=message.subject.removeprefix(f"{self.prefix}."),
                            kind=headers.get("Seckill-Event", ""),
                            content_type=headers.get("Content-Type", ""),
                            body=message.data,
                            persistent=persistent,
                            timestamp_s=None,
                        )
                    )
        finally:
            await reader.unsubscribe()
        return got

    async def limit(self, capacity: int) -> Sink:
        await self.jetstream.add_stream(
            StreamConfig(
                name=self.stream,
                subjects=[f"{self.prefix}.>"],
                storage=StorageType.FILE,
                max_msgs=capacity,
                discard=DiscardPolicy.NEW,  # a full stream refuses
                duplicate_window=60,
            )
        )
        return self.sink(**FAST)

    async def delete_topology(self) -> None:
        await self.jetstream.delete_stream(self.stream)

    async def cleanup(self) -> None:
        with contextlib.suppress(NotFoundError):
            await self.jetstream.delete_stream(self.stream)
        await self.client.close()


BROKERS = {"rabbitmq": RabbitMQ.connect, "nats": Nats.connect}
BROKER_URLS = {"rabbitmq": AMQP_URL, "nats": NATS_URL}
TESTED_BROKERS: list[Any] = [name for name, url in BROKER_URLS.items() if url] or [
    pytest.param(
        "rabbitmq",
        marks=pytest.mark.skip(
            reason="no broker to test: set SECKILL_TEST_AMQP_URL "
            "(e.g. amqp://guest:guest@127.0.0.1:5672/) or SECKILL_TEST_NATS_URL "
            "(e.g. nats://127.0.0.1:4222)"
        ),
    )
]


def sink_of(broker: Broker, sinks: list[Sink], **options: Any) -> Sink:
    sink = broker.sink(**options)
    sinks.append(sink)
    return sink


def elsewhere(url: str, port: int) -> str:
    """``url`` pointed at another port of 127.0.0.1."""
    parts = urlsplit(url)
    credentials = parts.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=f"{credentials}@127.0.0.1:{port}".lstrip("@")))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port

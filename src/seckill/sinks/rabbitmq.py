"""RabbitMQ through aio-pika: publisher confirms, persistent messages, a durable topic exchange.

Each message goes to the exchange (default ``seckill.orders``) with its routing key
(``order.paid``...), ``message_id`` (the stable id consumers deduplicate on), ``type`` (the
event), ``content_type`` ``application/json``, ``timestamp`` (when the event happened) and
delivery mode 2 (persistent). The default topology also declares a quorum queue (default
``seckill.orders``: replicated, and confirmed only once a majority has it) bound with
``order.#``; ``queue=None`` leaves queues and bindings to their owners.

Messages are published mandatory: one that no queue takes comes back instead of being dropped,
and the batch fails as :class:`SinkUnavailable` (a deleted queue is declared again on the next
publish). A topology whose queues take only some of the events is therefore refused: bind every
routing key somewhere, or give the exchange an alternate exchange.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

import aio_pika
from aio_pika.abc import AbstractConnection, AbstractExchange
from aio_pika.exceptions import AMQPError, ChannelInvalidStateError, DeliveryError, PublishError

from seckill.domain.times import ms_to_datetime
from seckill.sinks.base import (
    CONFIRM_TIMEOUT_S,
    CONNECT_TIMEOUT_S,
    SinkUnavailable,
    publish_in_order,
    redact_url,
)
from seckill.sinks.messages import CONTENT_TYPE, Message

DEFAULT_EXCHANGE = "seckill.orders"
DEFAULT_QUEUE = "seckill.orders"
DEFAULT_BINDING = "order.#"  # every order event; the routing keys are ROUTING_KEYS' values

# What a lost or refused connection raises, in aio-pika and below it.
_CONNECTION_ERRORS = (AMQPError, ChannelInvalidStateError, OSError, TimeoutError)


class RabbitMQSink:
    """Publishes to a RabbitMQ exchange and returns once the broker confirmed every message."""

    name = "rabbitmq"

    def __init__(
        self,
        url: str,
        *,
        exchange: str = DEFAULT_EXCHANGE,
        queue: str | None = DEFAULT_QUEUE,
        binding: str = DEFAULT_BINDING,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        confirm_timeout_s: float = CONFIRM_TIMEOUT_S,
    ) -> None:
        self.url = url
        self.exchange_name = exchange
        self.queue_name = queue
        self.binding = binding
        self.connect_timeout_s = connect_timeout_s
        self.confirm_timeout_s = confirm_timeout_s
        self._connection: AbstractConnection | None = None
        self._exchange: AbstractExchange | None = None
        self._opening = asyncio.Lock()

    def __repr__(self) -> str:
        return f"RabbitMQSink({redact_url(self.url)!r}, exchange={self.exchange_name!r})"

    async def open(self) -> None:
        await self._ready()

    async def publish(self, messages: Sequence[Message]) -> None:
        if not messages:
            return
        exchange = await self._ready()

        async def publish_one(message: Message) -> object:
            return await exchange.publish(_amqp_message(message), message.routing_key)

        try:
            await publish_in_order(
                messages,
                publish_one,
                broker=f"rabbitmq at {redact_url(self.url)}",
                timeout_s=self.confirm_timeout_s,
                lost=_CONNECTION_ERRORS,
                refusal=_refusal,
            )
        except SinkUnavailable:
            # The channel may be half broken (a lost connection, confirms still owed): start
            # afresh on the next publish, declaring the topology again.
            await self.close()
            raise

    async def close(self) -> None:
        connection, self._connection, self._exchange = self._connection, None, None
        if connection is not None:
            with contextlib.suppress(*_CONNECTION_ERRORS):
                async with asyncio.timeout(self.connect_timeout_s):
                    await connection.close()

    async def _ready(self) -> AbstractExchange:
        async with self._opening:
            if (
                self._exchange is not None
                and self._connection is not None
                and not self._connection.is_closed
            ):
                return self._exchange
            await self.close()
            try:
                async with asyncio.timeout(self.connect_timeout_s):
                    self._connection = await aio_pika.connect(
                        self.url, timeout=self.connect_timeout_s
                    )
                    self._exchange = await self._declare(self._connection)
            except _CONNECTION_ERRORS as exc:
                await self.close()
                raise SinkUnavailable(
                    f"rabbitmq at {redact_url(self.url)}: cannot open: {exc!r}"
                ) from exc
            return self._exchange

    async def _declare(self, connection: AbstractConnection) -> AbstractExchange:
        # on_return_raises: a message no queue took fails its publish instead of passing as sent.
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        exchange = await channel.declare_exchange(
            self.exchange_name, aio_pika.ExchangeType.TOPIC, durable=True
        )
        if self.queue_name is not None:
            queue = await channel.declare_queue(
                self.queue_name, durable=True, arguments={"x-queue-type": "quorum"}
            )
            await queue.bind(exchange, self.binding)
        return exchange


def _amqp_message(message: Message) -> aio_pika.Message:
    return aio_pika.Message(
        message.body,
        message_id=message.message_id,
        type=message.kind.value,
        content_type=CONTENT_TYPE,
        timestamp=ms_to_datetime(message.at_ms),
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
    )


def _refusal(error: BaseException) -> str | None:
    """A nack's reason; ``None`` for anything else (a returned message included: no queue
    took it, so nothing is stored, and the topology is what needs mending)."""
    if isinstance(error, DeliveryError) and not isinstance(error, PublishError):
        return "nacked by the broker"
    return None

"""NATS JetStream through nats-py: each message stored in a stream, confirmed by its PubAck.

A message goes to ``<subject prefix>.<routing key>`` (default ``seckill.orders.order.paid``)
with the headers ``Nats-Msg-Id`` (the stable message id), ``Content-Type`` and
``Seckill-Event`` (the event). Within the stream's duplicate window the server stores a message
id once: a redelivery is acknowledged as a duplicate, and counts as confirmed.

On open the sink makes sure its stream exists (default ``SECKILL_ORDERS``, subjects
``<prefix>.>``, file storage, a duplicate window of five minutes). A stream that already exists
is used as it is: its owner may have tuned its limits. The duplicate window has to outlast a
redelivery (the bridge's claim of entries left pending, a restart): past it, a message published
again is stored again, and only its id tells the copies apart.

No responder for a subject (the stream was deleted) fails the batch as :class:`SinkUnavailable`;
the next publish declares the stream again. An error in a PubAck (a full stream that discards
new messages) refuses that message.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Sequence

import nats
from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.api import Header, StorageType, StreamConfig
from nats.js.errors import APIError, NotFoundError

from seckill.sinks.base import (
    CONFIRM_TIMEOUT_S,
    CONNECT_TIMEOUT_S,
    SinkUnavailable,
    publish_in_order,
    redact_url,
)
from seckill.sinks.messages import CONTENT_TYPE, Message

log = logging.getLogger(__name__)

DEFAULT_STREAM = "SECKILL_ORDERS"
DEFAULT_SUBJECT_PREFIX = "seckill.orders"
DEFAULT_DUPLICATE_WINDOW_S = 300.0
EVENT_HEADER = "Seckill-Event"

_CONNECTION_ERRORS = (NatsError, OSError, TimeoutError)


class NatsSink:
    """Publishes to a JetStream stream and returns once every message is acknowledged."""

    name = "nats"

    def __init__(
        self,
        url: str,
        *,
        stream: str = DEFAULT_STREAM,
        subject_prefix: str = DEFAULT_SUBJECT_PREFIX,
        duplicate_window_s: float = DEFAULT_DUPLICATE_WINDOW_S,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        confirm_timeout_s: float = CONFIRM_TIMEOUT_S,
    ) -> None:
        self.url = url
        self.stream = stream
        self.subject_prefix = subject_prefix
        self.duplicate_window_s = duplicate_window_s
        self.connect_timeout_s = connect_timeout_s
        self.confirm_timeout_s = confirm_timeout_s
        self._client: Client | None = None
        self._jetstream: JetStreamContext | None = None
        self._opening = asyncio.Lock()

    def __repr__(self) -> str:
        return f"NatsSink({redact_url(self.url)!r}, stream={self.stream!r})"

    def subject(self, message: Message) -> str:
        """Where ``message`` is published: ``<subject prefix>.<routing key>``."""
        return f"{self.subject_prefix}.{message.routing_key}"

    async def open(self) -> None:
        await self._ready()

    async def publish(self, messages: Sequence[Message]) -> None:
        if not messages:
            return
        jetstream = await self._ready()

        async def publish_one(message: Message) -> object:
            # A PubAck marked duplicate is a confirm too: the stream has the message already.
            return await jetstream.publish(
                self.subject(message),
                message.body,
                timeout=self.confirm_timeout_s,
                headers=_headers(message),
            )

        try:
            await publish_in_order(
                messages,
                publish_one,
                broker=f"nats at {redact_url(self.url)}",
                timeout_s=self.confirm_timeout_s,
                lost=_CONNECTION_ERRORS,
                refusal=_refusal,
            )
        except SinkUnavailable:
            # Start afresh on the next publish: a new connection, the stream declared again.
            await self.close()
            raise

    async def close(self) -> None:
        client, self._client, self._jetstream = self._client, None, None
        if client is not None and not client.is_closed:
            with contextlib.suppress(*_CONNECTION_ERRORS):
                async with asyncio.timeout(self.connect_timeout_s):
                    await client.close()

    async def _ready(self) -> JetStreamContext:
        async with self._opening:
            if (
                self._jetstream is not None
                and self._client is not None
                and self._client.is_connected
            ):
                return self._jetstream
            await self.close()
            try:
                async with asyncio.timeout(self.connect_timeout_s):
                    self._client = await nats.connect(
                        self.url,
                        name="seckill",
                        connect_timeout=math.ceil(self.connect_timeout_s),
                        # No reconnecting in the background, where publishes would wait
                        # unseen: a lost connection fails the batch, and the next publish
                        # connects again. Two tries (max 1 reconnect) before giving up.
                        allow_reconnect=False,
                        max_reconnect_attempts=1,
                        reconnect_time_wait=0,
                        error_cb=_log_error,
                    )
                    jetstream = self._client.jetstream(timeout=self.connect_timeout_s)
                    await self._ensure_stream(jetstream)
            except _CONNECTION_ERRORS as exc:
                await self.close()
                raise SinkUnavailable(
                    f"nats at {redact_url(self.url)}: cannot open: {exc!r}"
                ) from exc
            self._jetstream = jetstream
            return jetstream

    async def _ensure_stream(self, jetstream: JetStreamContext) -> None:
        try:
            await jetstream.stream_info(self.stream)
        except NotFoundError:
            # Two sinks creating it at once is fine: the same config twice is one stream.
            await jetstream.add_stream(
                StreamConfig(
                    name=self.stream,
                    subjects=[f"{self.subject_prefix}.>"],
                    storage=StorageType.FILE,
                    duplicate_window=self.duplicate_window_s,
                )
            )


def _headers(message: Message) -> dict[str, str]:
    return {
        Header.MSG_ID.value: message.message_id,
        "Content-Type": CONTENT_TYPE,
        EVENT_HEADER: message.kind.value,
    }


def _refusal(error: BaseException) -> str | None:
    """The stream's reason for refusing a message; ``None`` when its fate is unknown (a
    timeout, a lost connection, no stream answering)."""
    if isinstance(error, APIError):
        return error.description or repr(error)
    return None


async def _log_error(error: Exception) -> None:
    # nats-py's default logs each one with a traceback; a failed publish says enough already.
    log.warning("nats: %r", error)

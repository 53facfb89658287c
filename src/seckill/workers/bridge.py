"""The bridge: forwards every item stream's events to a broker, for the shop's other systems.

A consumer group of its own on every item stream (``bridge_group``: one per sink, beside the
persister's, each with its own progress), read through ``seckill.engine.group_reader``. Each
pass publishes a batch through the sink (``seckill.sinks``) and acknowledges an entry **only
once the broker confirmed it**, so a crash or an outage never loses an event: it is published
again, with the same message id, and the consumer (or NATS itself) drops the copy.

Failures, by kind:
- the broker is unreachable or does not confirm in time: the batch is published again after a
  growing pause (capped) until it is confirmed or the worker is stopped; nothing new is read
  meanwhile, so the backlog waits in the stream (buying and the SQL persister go on);
- the broker refuses messages (a nack): the others are acknowledged, the refused stay pending
  and are published again once claimed; after ``max_deliveries`` an entry is a dead letter (an
  entry on the item's dead-letter stream naming the group, and a count), acknowledged;
- an entry that cannot be read as an event: a dead letter at once (the persister reports it
  too, in SQL);
- a crashed bridge: started again (its consumer is named after its host), it publishes what
  it had read and not seen confirmed before anything newer, so each order's events keep their
  order; a bridge that does not come back leaves them to go idle and be claimed by another.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from seckill.domain.dead_letters import dead_letter_fields
from seckill.domain.events import BadEvent, decode_event
from seckill.engine.cluster import RedisClient
from seckill.engine.group_reader import ConsumerConfig, Entry, GroupReader, as_read, one_pass
from seckill.observability import metrics
from seckill.sinks import (
    Message,
    Sink,
    SinkRefused,
    SinkUnavailable,
    bridge_group,
    order_message,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class BridgeConfig(ConsumerConfig):
    """How the bridge reads and retries (``ConsumerConfig``: the broker is its sink)."""

    retry_pause_s: float = 0.2  # first pause while the broker is unreachable (doubles, capped)


class Bridge:
    name = "bridge"

    def __init__(
        self,
        *,
        redis: RedisClient,
        sink: Sink,
        prefix: str,
        consumer: str | None = None,
        config: BridgeConfig | None = None,
        stop: asyncio.Event | None = None,
    ) -> None:
        self._redis = redis
        self._sink = sink
        # The host's name, the same after a restart: the bridge then starts with what it had
        # read and not seen confirmed (the reader's own pending entries), before anything
        # newer, so each order's events still reach the broker in their order.
        self.consumer = consumer or socket.gethostname()
        self.config = config or BridgeConfig()
        self._stop = stop or asyncio.Event()
        self.group = bridge_group(sink.name)
        self._reader = GroupReader(
            redis=redis, group=self.group, consumer=self.consumer, prefix=prefix,
            config=self.config,
        )  # fmt: skip
        self._reader.redis_failed()  # its own pending entries first
        self._published = metrics.BRIDGE_PUBLISHED.labels(sink=sink.name)
        self._retries = metrics.BRIDGE_RETRIES.labels(sink=sink.name)
        self.forwarded = 0
        self.dead_lettered = 0

    async def run_once(self) -> int:
        """Claim idle entries, read new ones, publish them; returns the entries confirmed."""
        return await one_pass(self._reader, self._forward, prepare=as_read)

    async def _forward(self, entries: Sequence[Entry]) -> int:
        """Publish, then acknowledge what the broker confirmed; returns how many."""
        if not entries:
            return 0
        sendable: list[tuple[Entry, Message]] = []
        nothing_to_send: list[Entry] = []  # item and stock events: not the shop's orders
        for entry in entries:
            try:
                event = decode_event(entry.entry_id, entry.fields, shard=entry.keys.shard)
                message = order_message(event, stream=entry.keys.events)
            except BadEvent as exc:
                await self._dead_letter(entry, str(exc), deliveries=1)
                continue
            if message is None:
                nothing_to_send.append(entry)
            else:
                sendable.append((entry, message))
        confirmed = await self._publish(sendable)
        await self._reader.ack(confirmed + nothing_to_send)
        self.forwarded += len(confirmed)
        self._published.inc(len(confirmed))
        return len(confirmed)

    async def _publish(self, batch: Sequence[tuple[Entry, Message]]) -> list[Entry]:
        """The entries whose messages the broker confirmed, retrying while it is unreachable."""
        pause = self.config.retry_pause_s
        while batch:
            try:
                await self._sink.publish([message for _, message in batch])
                return [entry for entry, _ in batch]
            except SinkUnavailable as exc:
                self._retries.inc()
                if self._stop.is_set():
                    log.warning("stopping with %s unreachable; %d entries stay pending",
                                self._sink.name, len(batch))  # fmt: skip
                    return []
                log.warning("%s unreachable (%s); publishing again in %.1f s",
                            self._sink.name, exc, pause)  # fmt: skip
                await asyncio.sleep(pause)
                pause = min(pause * 2, self.config.retry_pause_max_s)
            except SinkRefused as exc:
                self._retries.inc()
                refused = set(exc.message_ids)
                for entry, message in batch:
                    if message.message_id in refused:
                        await self._refused(entry, str(exc))
                return [entry for entry, message in batch if message.message_id not in refused]
        return []

    async def _refused(self, entry: Entry, error: str) -> None:
        """A message the broker refused: published again once claimed, dead after the last."""
        deliveries = await self._reader.deliveries(entry)
        if deliveries < self.config.max_deliveries:
            log.warning("%s refused entry %s of %s (delivery %d of %d): %s", self._sink.name,
                        entry.entry_id, entry.keys.events, deliveries,
                        self.config.max_deliveries, error)  # fmt: skip
            return
        await self._dead_letter(entry, error, deliveries=deliveries)

    async def _dead_letter(self, entry: Entry, error: str, *, deliveries: int) -> None:
        dead = dead_letter_fields(
            entry.fields, entry_id=entry.entry_id, group=self.group, error=error,
            deliveries=deliveries,
        )  # fmt: skip
        await self._redis.xadd(entry.keys.dead_letters, cast(Any, dead))
        await self._reader.ack([entry])
        self.dead_lettered += 1
        metrics.BRIDGE_DEAD_LETTERS.labels(sink=self._sink.name).inc()
        log.error("entry %s of %s is a dead letter of %s: %s", entry.entry_id,
                  entry.keys.events, self.group, error)  # fmt: skip

    async def close(self) -> None:
        await self._sink.close()
